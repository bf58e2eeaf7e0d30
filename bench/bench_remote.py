"""Our layer's overhead in front of vLLM (README "Scaling out"): the same greedy streamed
completions asked of vLLM's own /v1/completions with token ids, and of waste's
/v1/completions (waste --vllm, which tokenizes the text through vLLM and drives it with
the same ids), with C concurrent clients; the ratio of the two, measured in one run.

    python bench/bench_remote.py [--clients 1 4] [--requests 6] [--tokens 64] [--rounds 3]
                                 [--vllm URL --model ID]

Without --vllm it starts vLLM itself from .vllm-venv (``make vllm-env``) on the tiny random
Qwen2 of ``waste.tools.tiny_qwen2``: a model so small that vLLM's own per-token work is
minimal, so the ratio shows our layer at its most visible. Rounds alternate direct and
through-waste runs; medians are printed. vLLM's direct answers are checked to be the same
ids every time, and waste's answer to have the same prompt and completion token counts, so
both sides did the same work (tests/contract/test_vllm.py checks the ids themselves).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPT = ("Once upon a time there was a small model that answered every question with care. "
          "It thought before it spoke, and when it did not know, it said so. ")


def stream(url: str, body: dict) -> tuple[list[int], float, float]:
    """(token ids or empty, seconds to the first token, seconds in all) of one request."""
    started = time.perf_counter()
    first = None
    ids: list[int] = []
    count = 0
    with httpx.Client(timeout=300) as c, c.stream("POST", url, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or ():
                got = choice.get("token_ids") or []
                if choice.get("text") or got:
                    if first is None:
                        first = time.perf_counter() - started
                ids += got
                count += len(got) if got else int(bool(choice.get("text")))
    return ids, first or 0.0, time.perf_counter() - started


def run(clients: int, requests: int, make) -> dict:
    """``clients`` threads, each sending ``requests`` requests one after another."""
    def one_client(_: int) -> list:
        return [make() for _ in range(requests)]

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(one_client, range(clients)) for r in rs]
    wall = time.perf_counter() - started
    return {"wall_s": wall, "ttft_s": statistics.median(r[1] for r in results),
            "results": results}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--requests", type=int, default=6, help="per client, per run")
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens of each request")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vllm", help="a running vLLM (started with "
                        "--enable-tokenizer-info-endpoint); default: start one")
    parser.add_argument("--model", default="tiny", help="the model id it serves")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        vllm_server = None
        if args.vllm is None:
            from tests.contract.vllm_server import start_vllm
            from waste.tools.tiny_qwen2 import write_model

            model_dir = write_model(Path(tmp) / "tiny-qwen2")
            t0 = time.perf_counter()
            vllm_server = start_vllm(model_dir, Path(tmp) / "vllm.log")
            print(f"vLLM started in {time.perf_counter() - t0:.1f} s", flush=True)
            base = vllm_server.base
        else:
            base = args.vllm.rstrip("/")
        from tests.contract.vllm_server import free_port

        port = free_port()
        waste = subprocess.Popen(
            [sys.executable, "-m", "waste", "--vllm", base, "--vllm-model", args.model,
             "--port", str(port), "--max-concurrency", str(max(args.clients)),
             "--log-level", "info"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            assert waste.stdout is not None
            for line in waste.stdout:  # its log says when the engine is open
                if "engine ready" in line:
                    break
                if "engine failed to open" in line:
                    raise SystemExit(f"waste could not open vLLM: {line.strip()}")
            else:
                raise SystemExit("waste exited before its engine was ready")
            # Drain its (now quiet) output so it never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in waste.stdout], daemon=True).start()
            waste_base = f"http://127.0.0.1:{port}"
            httpx.get(waste_base + "/health", timeout=60).raise_for_status()
            return measure(args, base, waste_base)
        finally:
            waste.terminate()
            waste.wait(30)
            if vllm_server is not None:
                vllm_server.stop()


def measure(args, base: str, waste_base: str) -> int:
    ids = httpx.post(base + "/tokenize", json={"model": args.model, "prompt": PROMPT,
                                               "add_special_tokens": False}).json()["tokens"]
    info = httpx.get(base + "/tokenizer_info").json()
    eos = next(int(k) for k, v in info["added_tokens_decoder"].items()
               if (v if isinstance(v, str) else v.get("content")) == info["eos_token"])
    direct_body = {"model": args.model, "prompt": ids, "max_tokens": args.tokens,
                   "temperature": 0, "stream": True, "return_token_ids": True,
                   "ignore_eos": True, "stop_token_ids": [eos], "skip_special_tokens": False}
    waste_body = {"prompt": PROMPT, "max_tokens": args.tokens, "temperature": 0, "stream": True}
    direct = lambda: stream(base + "/v1/completions", direct_body)  # noqa: E731
    through = lambda: stream(waste_base + "/v1/completions", waste_body)  # noqa: E731
    expected = direct()[0]  # warm both paths once, and know the answer
    through()
    rows = []
    for clients in args.clients:
        walls = {"direct": [], "waste": []}
        ttfts = {"direct": [], "waste": []}
        for _ in range(args.rounds):
            for name, make in (("direct", direct), ("waste", through)):
                out = run(clients, args.requests, make)
                walls[name].append(out["wall_s"])
                ttfts[name].append(out["ttft_s"])
                if name == "direct":
                    assert all(r[0] == expected for r in out["results"]), "vLLM is not deterministic"
        tokens = clients * args.requests * len(expected)
        d, w = statistics.median(walls["direct"]), statistics.median(walls["waste"])
        row = {"clients": clients, "requests": clients * args.requests, "tokens": tokens,
               "direct_tok_s": round(tokens / d, 1), "waste_tok_s": round(tokens / w, 1),
               "throughput_ratio": round(d / w, 3),
               "direct_ttft_ms": round(1000 * statistics.median(ttfts["direct"]), 1),
               "waste_ttft_ms": round(1000 * statistics.median(ttfts["waste"]), 1),
               "per_token_overhead_ms": round(1000 * (w - d) * clients / tokens, 3)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    # the same answer through waste (its /v1/completions reports text; compare the count)
    usage = httpx.post(waste_base + "/v1/completions",
                       json={**waste_body, "stream": False}, timeout=300).json()["usage"]
    print(json.dumps({"same_prompt_tokens": usage["prompt_tokens"] == len(ids),
                      "same_completion_tokens": usage["completion_tokens"] == len(expected)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
