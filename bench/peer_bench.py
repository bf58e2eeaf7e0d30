"""libwaste against llama.cpp on the same weights, under the same memory cap, in one run.

``prepare`` turns the bench geometry into one synthetic Hugging Face checkpoint
(``waste.tools.synth``, bf16 like the release) and from it both engines' files: our
container (``waste.tools.convert``, int8 g32) and llama.cpp's GGUF (its converter, then its
quantizer to the paired Q8_0; peer_gguf.py). ``compare`` then runs each engine in a process
of its own (peer_decode.py) inside a fresh cgroup v1 memory group (memcap.py) whose limit is
our budget plus an allowance for the Python process around each engine, with the model files
evicted from the page cache before every run, alternating engines ``repeat`` times. The row
carries both rates, ours/peer, formats, the cap and how each engine ran; when something cannot
run it reads "not comparable: …" with the reason, never a number.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_physical import drop_page_cache  # noqa: E402
from memcap import CapUnavailable, MemoryCap  # noqa: E402
from peer_build import PEER_VERSION, Peer, PeerUnavailable  # noqa: E402
from peer_gguf import convert_to_gguf, peer_checkpoint, quantize  # noqa: E402
from waste.tools.convert import convert  # noqa: E402
from waste.tools.make_container import Geometry  # noqa: E402
from waste.tools.synth import synthesize  # noqa: E402

RUNNER = Path(__file__).resolve().parent / "peer_decode.py"
RUN_TIMEOUT_S = 3600


@attrs.frozen
class Models:
    """The same synthetic weights as both engines read them."""

    hf_dir: Path
    container: Path
    gguf: Path | None  # None: the peer's files could not be made (``why`` says why)
    gguf_type: str
    why: str
    seconds: dict


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _stamped(path: Path, stamp: Path, wanted: str) -> bool:
    return path.exists() and stamp.is_file() and stamp.read_text() == wanted


def prepare(name: str, geometry: Geometry, workdir: Path, peer: Peer | None, peer_why: str,
            threads: int, seed: int = 0) -> Models:
    """Synth checkpoint, our container and (with a peer) the GGUF in ``workdir``; each file is
    reused when an earlier run left it for the same geometry and seed."""
    wanted = json.dumps({"geometry": attrs.asdict(geometry), "seed": seed, "synth": "bf16"}, sort_keys=True)
    hf, container = workdir / f"{name}.hf", workdir / f"{name}.synth.waste"
    stamp = workdir / f"{name}.synth.json"
    seconds: dict = {}
    if not (_stamped(hf, stamp, wanted) and container.is_dir()):
        stamp.unlink(missing_ok=True)
        t = time.perf_counter()
        synthesize(hf, geometry=attrs.evolve(geometry, dtype="bf16"), seed=seed, dtype="bf16", overwrite=True)
        seconds["synth_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        convert(hf, container, trunk=geometry.dtype, experts=geometry.dtype, group=geometry.group,
                overwrite=True)
        seconds["convert_s"] = round(time.perf_counter() - t, 1)
        for old in workdir.glob(f"{name}.*.gguf"):
            old.unlink()
        stamp.write_text(wanted)
    if peer is None:
        return Models(hf, container, None, "", peer_why, seconds)
    gguf_type = {"int8": "Q8_0", "int4": "Q4_0"}.get(geometry.dtype, "")
    gguf = workdir / f"{name}.{gguf_type}.gguf"
    try:
        if not gguf.is_file():
            log = workdir / f"{name}.gguf.log"
            t = time.perf_counter()
            source = convert_to_gguf(peer, peer_checkpoint(hf, workdir / f"{name}.peer-hf"),
                                     workdir / f"{name}.bf16.gguf", log, "bf16")
            seconds["gguf_convert_s"] = round(time.perf_counter() - t, 1)
            t = time.perf_counter()
            quantize(peer, source, gguf, geometry.dtype, threads, log)
            seconds["gguf_quantize_s"] = round(time.perf_counter() - t, 1)
            source.unlink()
    except PeerUnavailable as exc:
        return Models(hf, container, None, gguf_type, str(exc), seconds)
    return Models(hf, container, gguf, gguf_type, "", seconds)


def _read_ahead_file(path: Path) -> Path | None:
    """``queue/read_ahead_kb`` of the block device holding ``path`` (a disk, or a partition's)."""
    dev = os.stat(path).st_dev
    node = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for queue in (node / "queue", node.resolve().parent / "queue"):
        if (queue / "read_ahead_kb").is_file():
            return queue / "read_ahead_kb"
    return None


def read_ahead_kb(path: Path) -> int | None:
    """The read-ahead of ``path``'s device: it sizes the read-around of every mmap page fault
    (llama.cpp also sets POSIX_FADV_SEQUENTIAL on its file, which doubles it)."""
    knob = _read_ahead_file(path)
    return int(knob.read_text()) if knob else None


@contextlib.contextmanager
def read_ahead(path: Path, kb: int | None):
    """Sets the device's read-ahead to ``kb`` for the block, then restores it; yields what the
    row should say. It is a machine-wide setting, hence opt-in (``--peer-read-ahead-kb``)."""
    before = read_ahead_kb(path)
    if kb is None or before is None or kb == before:
        yield {"read_ahead_kb": before}
        return
    knob = _read_ahead_file(path)
    try:
        knob.write_text(str(kb))
    except OSError as exc:
        yield {"read_ahead_kb": before, "read_ahead_note": f"could not set {kb} KB in {knob}: {exc}"}
        return
    try:
        yield {"read_ahead_kb": read_ahead_kb(path), "read_ahead_kb_restored_to": before}
    finally:
        knob.write_text(str(before))


def _files(models: Models) -> list[Path]:
    files = sorted(p for p in models.container.iterdir() if p.is_file())
    return files + ([models.gguf] if models.gguf else [])


def run_capped(engine: str, python: Path, model: Path, cap_bytes: int | None, tag: str,
               extra: list[str], files: list[Path]) -> dict:
    """One peer_decode.py run in a fresh memory group of ``cap_bytes`` (None: uncapped)."""
    dropped = drop_page_cache(files)
    cap, cap_note = None, "uncapped"
    if cap_bytes is not None:
        cap = MemoryCap.create(cap_bytes, f"waste-bench-{os.getpid()}-{tag}")
        cap_note = f"cgroup v1 {cap.path} memory.limit_in_bytes={cap.limit_bytes}"
    cmd = [str(python), str(RUNNER), "--engine", engine, "--model", str(model), *extra]
    if cap is not None:
        cmd += ["--cgroup", str(cap.path)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        usage = cap.usage() if cap is not None else {}
    finally:
        if cap is not None:
            cap.close()
    if done.returncode != 0:
        killed = " (killed: out of memory under the cap?)" if done.returncode == -9 else ""
        tail = " | ".join(done.stderr.strip().splitlines()[-4:])
        return {"engine": engine, "error": f"exited {done.returncode}{killed}: {tail}"}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {**result, "cap": cap_note, "cgroup": usage, "page_cache_drop": dropped}


def _summary(run: dict) -> dict:
    keep = ("engine", "tok_per_s", "seconds", "load_s", "prefill_s", "token_s_min", "token_s_max",
            "h", "major_faults_measured", "max_rss_bytes", "cgroup", "cap", "error")
    return {k: run[k] for k in keep if k in run}


def same_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# llama.cpp's repacked/AMX weight buffers abort on this model on an AMX CPU
# (GGML_ASSERT(*cur_backend_id != -1) in ggml_backend_sched_split_graph): plain CPU buffers.
LLAMA_FLAGS = ["--no-extra-bufts"]


def _engine_flags(options) -> list[str]:
    """peer_decode.py's flags for libwaste's reading ahead and activations, as the bench runs it."""
    return ["--io-threads", str(options.io_threads), "--lookahead", str(options.lookahead),
            "--activations", options.activations]


def in_ram(models: Models, peer: Peer, *, budget: int, prompt: list[int], warmup: int, tokens: int,
           threads: int, repeat: int, options, C: float) -> dict:
    """The in-RAM pair: both engines uncapped and warm (every weight the measured pass uses
    was touched by an untimed first pass), libwaste at a budget holding every expert and its
    default prefill chunk, llama.cpp as a user runs it. Decode tok/s at batch 1 and prefill
    tok/s of the prompt; F_peer = C x llama.cpp's tok/s, the rate its whole decode reaches
    (a lower bound of its kernels')."""
    row = {"row": "in_ram", "peer_format": models.gguf_type, "our_format": "int8 g32",
           "budget_bytes": budget, "prompt_tokens": len(prompt), "tokens": tokens, "threads": threads,
           "activations": options.activations}
    common = ["--prompt", json.dumps(prompt), "--warmup", str(warmup), "--tokens", str(tokens),
              "--threads", str(threads), "--twice"]
    files = _files(models)
    runs = []
    for i in range(repeat):
        runs.append(run_capped("waste", Path(sys.executable), models.container, None, f"ramw{i}",
                               [*common, "--budget", str(budget), "--policy", options.cache_policy,
                                "--prefill-chunk", "0", *_engine_flags(options)], files))
        runs.append(run_capped("llama", peer.python, models.gguf, None, f"raml{i}", [*common, *LLAMA_FLAGS], files))
    row["runs"] = [_summary(r) for r in runs]
    failed = [r for r in runs if "error" in r]
    if failed:
        row["status"] = "not comparable: " + "; ".join(f"{r['engine']} {r['error']}" for r in failed)
        return row
    ours = [r for r in runs if r["engine"] == "libwaste"]
    theirs = [r for r in runs if r["engine"] == "llama.cpp"]
    rate = lambda rs: tokens * len(rs) / sum(r["seconds"] for r in rs)  # noqa: E731
    prefill = lambda rs: len(prompt) * len(rs) / sum(r["prefill_s"] for r in rs)  # noqa: E731
    row.update(status="measured", ours_tok_s=rate(ours), peer_tok_s=rate(theirs),
               ratio_ours_over_peer=rate(ours) / rate(theirs),
               ours_prefill_tok_s=prefill(ours), peer_prefill_tok_s=prefill(theirs),
               h_ours=sum(r["h"] for r in ours) / len(ours),
               C_flops=C, F_peer=C * rate(theirs), F_ours_decode=C * rate(ours))
    return row


def in_ram_line(row: dict) -> str:
    if row.get("status") != "measured":
        return f"in RAM: {row.get('status')}"
    return (f"in RAM (warm, uncapped): libwaste {row['our_format']} ({row['activations']}) "
            f"{row['ours_tok_s']:.2f} tok/s, llama.cpp {row['peer_format']} {row['peer_tok_s']:.2f} tok/s: "
            f"ours/peer = {row['ratio_ours_over_peer']:.2f}x; prefill of {row['prompt_tokens']} tokens "
            f"{row['ours_prefill_tok_s']:.1f} vs {row['peer_prefill_tok_s']:.1f} tok/s; "
            f"llama.cpp's F = C x tok/s = {row['F_peer'] / 1e9:.1f} GFLOP/s")


def compare(models: Models, peer: Peer, *, budget: int, fraction: float, allowance: int,
            prompt: list[int], warmup: int, tokens: int, threads: int, repeat: int,
            policy: str, options=None, read_ahead_kb_wanted: int | None = None) -> dict:
    """The peer row: both engines, alternating, under the same cap."""
    row = {"row": "peer", "engine": "llama.cpp", "llama_cpp_python": PEER_VERSION,
           "peer_build": peer.how, "peer_format": models.gguf_type, "our_format": "int8 g32",
           "cache_fraction": fraction, "budget_bytes": budget, "allowance_bytes": allowance,
           "prompt": prompt, "warmup_tokens": warmup, "tokens": tokens, "threads": threads,
           "gguf_bytes": models.gguf.stat().st_size,
           "container_bytes": _dir_bytes(models.container), "prepare": models.seconds,
           "how": {"llama.cpp": "llama-cpp-python Llama(use_mmap=True, n_ctx small), eval of one "
                                "token per step, argmax in Python; weights paged in by mmap",
                   "libwaste": f"NativeEngine(ram_budget_bytes={budget}, {policy}, O_DIRECT expert "
                               "reads, prefill_chunk=1"
                               + (f", io_threads={options.io_threads}, lookahead={options.lookahead}, "
                                  f"activations={options.activations}" if options is not None else "")
                               + "), eval of one token per step, argmax in Python"}}
    cap_bytes: int | None = budget + allowance
    try:
        MemoryCap.create(cap_bytes, f"waste-bench-{os.getpid()}-probe").close()
        row["cap_bytes"] = cap_bytes
    except CapUnavailable as exc:
        cap_bytes = None
        row["cap_bytes"] = None
        row["cap_note"] = f"not capped: {exc}; both engines ran uncapped"
    common = ["--prompt", json.dumps(prompt), "--warmup", str(warmup), "--tokens", str(tokens),
              "--threads", str(threads)]
    files = _files(models)
    runs = []
    with read_ahead(models.gguf, read_ahead_kb_wanted) as ra:
        row.update(ra)
        for i in range(repeat):
            runs.append(run_capped("waste", Path(sys.executable), models.container, cap_bytes, f"waste{i}",
                                   [*common, "--budget", str(budget), "--policy", policy,
                                    *(_engine_flags(options) if options is not None else [])], files))
            runs.append(run_capped("llama", peer.python, models.gguf, cap_bytes, f"llama{i}",
                                   [*common, *LLAMA_FLAGS], files))
    row["runs"] = [_summary(r) for r in runs]
    failed = [r for r in runs if "error" in r]
    if failed:
        row["status"] = "not comparable: " + "; ".join(f"{r['engine']} {r['error']}" for r in failed)
        return row
    ours = [r for r in runs if r["engine"] == "libwaste"]
    theirs = [r for r in runs if r["engine"] == "llama.cpp"]
    ours_rate = tokens * len(ours) / sum(r["seconds"] for r in ours)
    peer_rate = tokens * len(theirs) / sum(r["seconds"] for r in theirs)
    row.update(status="measured", ours_tok_s=ours_rate, peer_tok_s=peer_rate,
               ratio_ours_over_peer=ours_rate / peer_rate,
               h_ours=sum(r["h"] for r in ours) / len(ours),
               greedy_ids_agree_prefix=same_prefix(ours[0]["token_ids"], theirs[0]["token_ids"]),
               greedy_ids_compared=len(ours[0]["token_ids"]),
               system_info=theirs[0].get("system_info"))
    return row


def unavailable(why: str, **context) -> dict:
    """The peer row when nothing could be measured: the reason, no numbers."""
    return {"row": "peer", "engine": "llama.cpp", "llama_cpp_python": PEER_VERSION,
            "status": why if why.startswith("not ") else f"not comparable: {why}", **context}


def table_line(row: dict) -> str:
    """The peer line of the bench's table."""
    if row.get("status") != "measured":
        return f"peer: llama.cpp {row.get('status')}"
    cap = (f"{row['cap_bytes'] / 2**20:.0f} MiB cgroup v1 cap" if row.get("cap_bytes")
           else "NO cap (cgroup v1 unavailable)")
    return (f"peer: llama.cpp {row['peer_format']} {row['peer_tok_s']:.2f} tok/s, libwaste "
            f"{row['our_format']} {row['ours_tok_s']:.2f} tok/s (h {row['h_ours']:.2f}) at cache "
            f"{row['cache_fraction']}, {cap}, read-ahead {row['read_ahead_kb']} KB: "
            f"ours/peer = {row['ratio_ours_over_peer']:.2f}x")


def build_peer(build: bool) -> tuple[Peer | None, str]:
    """(the peer, "") or (None, why not)."""
    from peer_build import ensure_peer

    if shutil.which("cmake") is None and build:
        return None, "not comparable: cmake is not installed (the peer builds from its sdist)"
    try:
        import torch  # noqa: F401  (llama.cpp's converter imports torch)
    except ImportError as exc:
        return None, f"not comparable: llama.cpp's convert_hf_to_gguf.py needs torch ({exc}): install '.[oracle]'"
    try:
        return ensure_peer(build=build), ""
    except PeerUnavailable as exc:
        return None, f"not comparable: {exc}"
