"""In-RAM pairs (warm, uncapped), engines alternating twice: libwaste q8, libwaste f32, llama.cpp.

``.venv/bin/python bench/inram_pair.py CONTAINER GGUF [TOKENS]`` with the container and GGUF a
``bench_engine.py --peer --out DIR`` run kept in DIR (``*.synth.waste``, ``*.Q8_0.gguf``). Each
run is ``peer_decode.py --twice`` (decode once untimed, reset, then time TOKENS tokens after 8
prompt and 4 warm-up tokens) at nice 19 with ``OMP_WAIT_POLICY=passive`` unless the caller's
environment sets it (llama.cpp's OpenMP threads spin otherwise: much slower on a loaded machine,
faster on a quiet one, where ``OMP_WAIT_POLICY=active`` is the fair choice) and llama.cpp's extra weight buffers off (they
abort on this model on an AMX CPU). Prints one JSON line per run, then the means.
"""
import json, os, subprocess, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_decode import budget_for
from waste.adapters.native.options import NativeOptions
cont, gguf = sys.argv[1], sys.argv[2]
budget, _ = budget_for(Path(cont), NativeOptions(ctx_tokens=128, usage_path="", n_threads=2), None)
prompt = json.dumps([17, 250, 33, 401, 8, 77, 129, 300])
tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 32
common = ["--prompt", prompt, "--warmup", "4", "--tokens", str(tokens), "--threads", "2", "--twice"]
env = dict(os.environ)
env.setdefault("OMP_WAIT_POLICY", "passive")  # OMP_WAIT_POLICY=active in the caller's env: spin (quiet machine)
runs = []
for rep in range(2):
    for name, cmd in (
        ("waste q8", [sys.executable, str(HERE / "peer_decode.py"), "--engine", "waste", "--model", cont, "--budget", str(budget),
                      "--prefill-chunk", "0", "--activations", "q8", *common]),
        ("waste f32", [sys.executable, str(HERE / "peer_decode.py"), "--engine", "waste", "--model", cont, "--budget", str(budget),
                       "--prefill-chunk", "0", "--activations", "f32", *common]),
        ("llama Q8_0", [str(HERE / ".peer-venv/bin/python"), str(HERE / "peer_decode.py"), "--engine", "llama", "--model", gguf,
                        "--no-extra-bufts", *common]),
    ):
        t0 = time.time(); load0 = os.getloadavg()[0]
        out = subprocess.run(["nice", "-n", "19", *cmd], capture_output=True, text=True, env=env)
        if out.returncode:
            print(name, "FAILED", out.stderr[-500:]); continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        cpu = r["user_s"] + r["system_s"]
        row = {"run": name, "rep": rep, "tok_s": round(r["tok_per_s"], 3), "prefill_tok_s": round(8 / r["prefill_s"], 2),
               "h": r.get("h"), "token_s_min": round(r["token_s_min"], 4), "loadavg": load0, "cpu_s_total": round(cpu, 1)}
        runs.append(row); print(json.dumps(row), flush=True)
for name in ("waste q8", "waste f32", "llama Q8_0"):
    rs = [r for r in runs if r["run"] == name]
    if rs:
        print(name, "mean tok/s", sum(r["tok_s"] for r in rs) / len(rs), "best", max(r["tok_s"] for r in rs),
              "prefill", sum(r["prefill_tok_s"] for r in rs) / len(rs))
