"""What perfect routing knowledge would be worth: bench_engine.py rows with an oracle predictor.

``.venv/bin/python bench/bench_oracle.py --out DIR [--budget-fraction 0.3] [--depth 1 2 3]
[--repeat 2] [--tokens N] [--keep-trace PATH]`` builds libwaste with ``bench/oracle_prefetch.patch`` in a temporary git worktree
of HEAD (never in the tree), then runs ``bench_engine.py --out DIR`` with it three ways:

1. once with ``WASTE_ORACLE_RECORD``: the last engine opened (the cache-fraction run) writes
   every decode MoE layer's selected experts to a trace;
2. as is (the patched build without the variables behaves as HEAD): the reference rows;
3. per depth d with ``WASTE_ORACLE_TRACE``: the replayed run routes exactly as the recorded
   one (logits do not depend on the cache), and where the lookahead guesses it also reads
   the true experts of the next d MoE layers of the same token.

``--keep-trace`` copies the trace to PATH (``bench/policy_sim.py`` replays cache policies on it);
``--depth`` with no value records only. The rows are bench_engine's (the ratio against the bound with W and F probed between
segments). Each replayed engine checks every layer against the trace and reports on stderr;
any difference fails the run. ``DIR`` is a bench_engine ``--out`` directory (the container is
reused; its results.jsonl is overwritten by each run).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, **kw)


def build(worktree: Path) -> None:
    run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(worktree), "HEAD"])
    run(["git", "-C", str(worktree), "apply", str(ROOT / "bench" / "oracle_prefetch.patch")])
    run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=worktree,
        stdout=subprocess.DEVNULL)


def bench_rows(worktree: Path, args: argparse.Namespace, env_extra: dict[str, str], repeat: int) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(worktree / "src"), **env_extra)
    cmd = [sys.executable, str(worktree / "bench" / "bench_engine.py"), "--out", str(args.out),
           "--budget-fraction", str(args.budget_fraction), "--repeat", str(repeat), "--tokens", str(args.tokens)]
    p = subprocess.run(cmd, env=env, text=True, capture_output=True)
    if p.returncode:
        sys.exit(f"bench_engine failed ({p.returncode}):\n{p.stderr[-4000:]}")
    differ = [m for m in re.findall(r"oracle: (\d+) of (\d+) layers differ", p.stderr) if m[0] != "0"]
    if differ:
        sys.exit(f"the replayed run did not route as the recorded one: {differ}")
    lines = p.stdout.splitlines()
    head = [ln for ln in lines if ln.startswith("# cache")]
    return head[:1] + [ln for ln in lines if ln.startswith(f"#   {args.budget_fraction}")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="a bench_engine --out directory")
    ap.add_argument("--budget-fraction", type=float, default=0.3)
    ap.add_argument("--depth", type=int, nargs="*", default=[1, 2, 3],
                    help="MoE layers ahead (default 1 2 3; none: record the trace only)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64, help="bench_engine's measured tokens (default 64)")
    ap.add_argument("--keep-trace", type=Path, help="copy the recorded trace here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        worktree, trace = Path(tmp) / "oracle", Path(tmp) / "trace.bin"
        try:
            build(worktree)
            bench_rows(worktree, args, {"WASTE_ORACLE_RECORD": str(trace)}, 1)
            print(f"# trace: {trace.stat().st_size} bytes")
            if args.keep_trace is not None:
                shutil.copyfile(trace, args.keep_trace)
            if not args.depth:
                return
            for label, extra in [("lookahead as in HEAD", {})] + [
                    (f"oracle, true experts {d} MoE layer(s) ahead", {"WASTE_ORACLE_TRACE": str(trace),
                                                                    "WASTE_ORACLE_DEPTH": str(d)})
                    for d in args.depth]:
                rows = bench_rows(worktree, args, extra, args.repeat)
                print(f"# {label}")
                print("\n".join(rows), flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                           capture_output=True)


if __name__ == "__main__":
    main()
