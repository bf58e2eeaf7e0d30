"""libwaste's decode speed against the physical bound of docs/ENGINE.md §8, measured in one run.

``.venv/bin/python bench/bench_engine.py [--quick] [--out DIR] [--budget-fraction 0.1 0.3] [--peer]``
builds a synthetic Kimi-Linear-like container, measures W, M and F on this machine, decodes
at each cache size and prints JSON lines (then a table, every line prefixed with "# ").
``--peer`` builds the container from a synthetic Hugging Face checkpoint instead and runs
llama.cpp on the same weights under the same memory cap (peer_bench.py). ``--k3`` runs a
Kimi K3-geometry container instead: ``waste.tools.synth --arch k3`` (the release layout, MXFP4
experts packed by compressed-tensors, every K3 delta on) converted with ``--experts source``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_decode import PROMPT_TOKENS, budget_for, decode_run, prompt_ids  # noqa: E402
from bench_bound import attention_flops, bound_terms, resident_read_bytes  # noqa: E402
from bench_physical import (BankReader, build_kernel_probe, drop_page_cache, llc_bytes,  # noqa: E402
                            measure_kernel, measure_kernel_while_reading, measure_ram)
from peer_bench import build_peer, compare, in_ram, in_ram_line, prepare, table_line, unavailable  # noqa: E402
from waste.adapters.native.context import library_build_info, plan_memory  # noqa: E402
from waste.adapters.native.engine import NativeEngine  # noqa: E402
from waste.adapters.native.options import NativeOptions  # noqa: E402
from waste.tools.make_container import Geometry, build_container  # noqa: E402
from waste.tools.synth_k3 import K3Options  # noqa: E402

# Kimi-Linear-48B: 27 layers, MLA at 0-based 3, 7, 11, 15, 19, 23, 26; layer 0 dense.
KIMI_LAYOUT = "".join("M" if i in (3, 7, 11, 15, 19, 23, 26) else "K" for i in range(27))
GEOMETRIES = {
    # Kimi-Linear's layer stack, k and head dims at hidden 1024 (2304 in the release): 32
    # experts per layer (256), moe_inter 512 (1024), 16 KDA/MLA heads (32), int8 g32.
    "kimi-linear-h1024": Geometry(
        layers=27, layout=KIMI_LAYOUT, hidden=1024, intermediate=4096, moe_intermediate=512,
        experts=32, top_k=8, shared=1, dense=1, kda_heads=16, kda_head_dim=128, conv_kernel=4,
        mla_heads=16, kv_lora_rank=512, qk_nope=128, qk_rope=64, v_head=128,
        dtype="int8", group=32),
    # --quick: 8 layers (6 MoE), hidden 512, the same k and expert count.
    "quick-h512": Geometry(
        layers=8, layout="KKKMKKKM", hidden=512, intermediate=1024, moe_intermediate=256,
        experts=32, top_k=8, shared=1, dense=1, kda_heads=4, kda_head_dim=128, conv_kernel=4,
        mla_heads=4, kv_lora_rank=256, qk_nope=64, qk_rope=32, v_head=64,
        dtype="int8", group=32),
}
# Kimi K3 scaled to this machine (docs/ENGINE.md §4.2: 93 layers, hidden 7168, latent 3584,
# moe_inter 3072, 896 experts, top-16, 2 shared, q-LoRA 1536, blocks of 12): 16 layers with MLA
# every 4th (K3's 3:1), hidden 1024, latent 512, moe_inter 512, 32 experts per layer with
# top-8, 2 shared, q-LoRA 512, kv_lora 512, attention-residual blocks of 12, first layer MoE;
# MXFP4 experts (record 0.42 MiB), bf16 trunk. (compressed-tensors packs ~1 M weights/s here,
# which bounds the expert count.) --quick: 8 layers, hidden 512, blocks of 4.
K3_GEOMETRIES = {
    "k3-h1024": (Geometry(layers=16, hidden=1024, intermediate=4096, moe_intermediate=512, experts=32, top_k=8,
                          shared=2, dense=0, kda_heads=8, kda_head_dim=128, conv_kernel=4, mla_heads=8,
                          kv_lora_rank=512, qk_nope=128, qk_rope=64, v_head=128),
                 K3Options(q_lora_rank=512, latent=512, attn_res_block=12)),
    "k3-quick-h512": (Geometry(layers=8, hidden=512, intermediate=1024, moe_intermediate=256, experts=32, top_k=8,
                               shared=2, dense=0, kda_heads=4, kda_head_dim=128, conv_kernel=4, mla_heads=4,
                               kv_lora_rank=256, qk_nope=64, qk_rope=32, v_head=64),
                      K3Options(q_lora_rank=256, latent=256, attn_res_block=4)),
}
PEER_ROW = {"row": "peer", "engine": "llama.cpp",
            "status": "not measured (run with --peer: it builds llama-cpp-python, ~15 min once)"}


def emit(row: dict, sink: list[dict]) -> None:
    sink.append(row)
    print(json.dumps(row, default=_json_default), flush=True)


def _json_default(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"not JSON: {value!r}")


def cpu_snapshot() -> tuple[float, float, float]:
    """(CPU-seconds busy on the whole machine, CPU-seconds used by this process and by the
    probes it ran (its waited-for children: the F and F_io probes), CPU-seconds stolen by the
    hypervisor: /proc/stat's steal, which "busy" includes)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    busy = (sum(fields[:8]) - idle) / tick
    steal = (fields[7] if len(fields) > 7 else 0) / tick
    own = os.times()
    return busy, own.user + own.system + own.children_user + own.children_system, steal


def source_state() -> dict:
    """The checkout measured: HEAD and whether native/ has uncommitted changes."""
    root = Path(__file__).resolve().parents[1]

    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(root), *cmd], capture_output=True,
                                  text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"git_head": git("rev-parse", "--short", "HEAD") or None,
            "native_uncommitted": bool(git("status", "--porcelain", "native/"))}


def container_for(name: str, geometry: Geometry, workdir: Path, keep: bool) -> tuple[Path, float]:
    """The benchmark container in ``workdir``; reused when kept from an earlier ``--out`` run
    with the same geometry. Returns (path, seconds spent building)."""
    path = workdir / f"{name}.waste"
    stamp = workdir / f"{name}.geometry.json"
    wanted = json.dumps(attrs.asdict(geometry), sort_keys=True)
    if keep and path.is_dir() and stamp.is_file() and stamp.read_text() == wanted:
        return path, 0.0
    expert_params = 3 * geometry.hidden * geometry.moe_intermediate
    need = (geometry.layers - geometry.dense) * geometry.experts * expert_params * 1.1 + (1 << 30)
    free = shutil.disk_usage(workdir).free
    if free < need:
        raise SystemExit(f"bench: {workdir} has {free >> 20} MiB free, the container needs ~{int(need) >> 20} MiB")
    started = time.perf_counter()
    build_container(path, geometry=geometry, chat_json="none", overwrite=True)
    if keep:
        stamp.write_text(wanted)
    return path, time.perf_counter() - started


def k3_container_for(name: str, workdir: Path, keep: bool) -> tuple[Path, float]:
    """The K3 benchmark container: synth --arch k3 (seed 0), then convert --experts source
    (MXFP4 experts kept, bf16 trunk kept); reused when kept with the same geometry."""
    from waste.tools.convert import convert
    from waste.tools.synth_k3 import synthesize_k3

    geometry, options = K3_GEOMETRIES[name]
    path, hf = workdir / f"{name}.waste", workdir / f"{name}-hf"
    stamp = workdir / f"{name}.geometry.json"
    wanted = json.dumps({**attrs.asdict(geometry), **attrs.asdict(options)}, sort_keys=True)
    if keep and path.is_dir() and stamp.is_file() and stamp.read_text() == wanted:
        return path, 0.0
    started = time.perf_counter()
    synthesize_k3(hf, geometry=geometry, options=options, seed=0, overwrite=True)
    convert(hf, path, overwrite=True, note=None)
    shutil.rmtree(hf, ignore_errors=True)
    if keep:
        stamp.write_text(wanted)
    return path, time.perf_counter() - started


def table(rows: list[dict]) -> list[str]:
    """The human summary: start-up probes, then one line per decode run."""
    by = lambda kind: [r for r in rows if r["row"] == kind]  # noqa: E731
    out = ["start-up probes (each decode run re-probes W and F between its segments and uses those):"]
    for w in by("W"):
        out.append(f"  W depth {w['depth']} ({w['mode']}): {w['bytes_per_s'] / 1e9:.2f} GB/s, "
                   f"{w['ms_per_read']:.2f} ms per {w['record_bytes'] / 2**20:.2f} MiB record"
                   )
    for m in by("M"):
        out.append(f"  M {m['threads']} thread(s): {m['bytes_per_s'] / 1e9:.1f} GB/s")
    for f in by("F"):
        out.append(f"  F {f['format']} {f['kernel']} {f.get('activations', 'f32')} {f['threads']} thread(s), {f['experts_resident']} "
                   f"experts resident ({f['resident_bytes'] / 2**20:.0f} MiB): "
                   f"{f['flops_per_s'] / 1e9:.1f} GFLOP/s")
    for f in by("F_io"):
        out.append(f"  F_io the same, while {f['read_depth']} reader(s) stream records "
                   f"({f['W_during'] / 1e9:.2f} GB/s): {f['flops_per_s'] / 1e9:.1f} GFLOP/s")
    for f in by("F_derived"):
        out.append(f"  F derived from the all-cached decode: {f['flops_per_s'] / 1e9:.1f} GFLOP/s")
    out.append("")
    out.append(f"{'cache':>5} {'slots':>5} {'/WS':>4} {'tok/s':>6} {'h':>5} {'MB/tok':>6} "
               f"{'W GB/s':>6} {'F GF/s':>6} | {'disk':>6} {'ram':>5} {'comp':>5} {'bound':>5} "
               f"{'ratio':>5} | {'serial':>6} {'ratio':>5} | {'F_io':>4} {'cont':>5} {'ratio':>5} | {'io%':>4} {'busy%':>5} {'QD':>3} {'la acc':>6} "
               f"{'others':>6} {'steal':>5}")
    for d in by("decode"):
        disk = "inf" if d["bound_disk_tok_s"] is None else f"{d['bound_disk_tok_s']:.2f}"
        out.append(
            f"{str(d['cache']):>5} {d['slots']:>5} {d['slots'] / d['working_set_records']:>4.1f} "
            f"{d['tok_per_s']:>6.2f} {d['h']:>5.2f} {d['bytes_read_per_token'] / 1e6:>6.1f} "
            f"{d['W_mean'] / 1e9:>6.2f} {d['F_mean'] / 1e9:>6.1f} | {disk:>6} {d['bound_ram_tok_s']:>5.1f} "
            f"{d['bound_compute_tok_s']:>5.1f} {d['bound_tok_s']:>5.2f} {100 * d['ratio']:>4.0f}% | "
            f"{d['serial_bound_tok_s']:>6.2f} {100 * d['ratio_serial']:>4.0f}% | {contended_cells(d)} | "
            f"{100 * d['io_share']:>3.0f}% {100 * d['disk_busy_share']:>4.0f}% {d['queue_depth_max']:>3} "
            f"{'-' if d['lookahead_accuracy'] is None else format(d['lookahead_accuracy'], '.2f'):>6} "
            f"{100 * d['other_cpu_share']:>5.0f}% {100 * d.get('steal_cpu_share', 0.0):>4.0f}%")
    out.extend(in_ram_line(p) for p in by("in_ram"))
    out.extend(table_line(p) for p in by("peer"))
    return out


def contended_cells(d: dict) -> str:
    """F_io/F, the contended bound and our ratio to it; dashes for a run that does not stream."""
    if d["contended_bound_tok_s"] is None:
        return f"{'-':>4} {'-':>5} {'-':>5}"
    return (f"{d['F_io_share_mean']:>4.2f} {d['contended_bound_tok_s']:>5.2f} "
            f"{100 * d['ratio_contended']:>4.0f}%")


@attrs.define
class Bench:
    """One benchmark run: the container, its manifest and plan, and the probes it reuses."""

    container: Path
    banks: list[dict]
    record_bytes: int
    threads: int
    disk_s: float
    probe_s: float
    segment_probe_s: float
    reader: BankReader
    probe: Path | None = None
    probe_note: str = ""
    depth: int = 1  # the engine's read queue depth (io_threads, at least 1): W is probed there
    activations: str = "f32"  # the engine's cfg.activations: the kernel probe runs the same path
    F_peer: float = 0.0  # llama.cpp's compute rate on the same weights (C x its in-RAM tok/s), 0 unknown

    def kernel_args(self, experts: int, threads: int, repeats: int = 3) -> dict:
        moe_inter, hidden = self.banks[0]["shapes"][0]  # gate [I, H], up [I, H], down [H, I]
        return dict(fmt=self.banks[0]["format"], group=self.banks[0]["group"] or 32,
                    hidden=hidden, moe_inter=moe_inter, experts=experts, threads=threads,
                    seconds=self.probe_s, repeats=repeats,
                    activations=self.activations if self.banks[0]["format"] in ("int8", "int4", "mxfp4") else "f32")

    @property
    def llc_experts(self) -> int:
        """Experts that fit in a quarter of the LLC: the kernel probe's compute-bound set."""
        return max(1, llc_bytes() // 4 // self.record_bytes)

    @property
    def ram_experts(self) -> int:
        """Experts filling 4x the LLC (at least 64, at most 2 GiB): the probe's rate with its
        weights coming from RAM, as the decode's matvecs get them. Printed, not in the bound."""
        llc4 = 4 * llc_bytes() // self.record_bytes + 1
        return max(64, min(llc4, (2 << 30) // self.record_bytes))

    def machine(self, workdir: Path, emit_row) -> tuple[float, float | None]:
        """The W, M and F rows at start-up; returns (M, F or None without a probe)."""
        for depth in sorted({1, 2, self.depth}):
            emit_row(self.reader.measure(depth=depth, seconds=self.disk_s))
        m = 0.0
        for t in sorted({1, self.threads}):
            # 32x the LLC, at least 1 GiB, at most 4 GiB (a VM may list a 480 MiB "LLC": 32x
            # that is 15 GiB of a shared machine's RAM)
            row = measure_ram(threads=t, buffer_bytes=min(4 << 30, max(1 << 30, 32 * llc_bytes())))
            emit_row(row)
            m = row["bytes_per_s"] if t == self.threads else m
        self.probe, self.probe_note = build_kernel_probe(workdir)
        f = None
        if self.probe is not None:
            for t, experts in ((1, self.llc_experts), (self.threads, self.llc_experts),
                               (self.threads, self.ram_experts)):
                row = measure_kernel(self.probe, **self.kernel_args(experts, t))
                row["source"] = self.probe_note
                if t == self.threads and experts == self.llc_experts:
                    f = row["flops_per_s"]
                emit_row(row)
            emit_row({**self.kernel_while_reading(repeats=3), "source": self.probe_note})
        return m, f

    def kernel_while_reading(self, repeats: int) -> dict:
        """The kernel probe's F_io row: its rate while the disk streams at the engine's depth."""
        assert self.probe is not None
        return measure_kernel_while_reading(self.probe, self.reader, depth=self.depth,
                                            **self.kernel_args(self.llc_experts, self.threads, repeats))

    def probe_now(self, F_fallback: float | None, streaming: bool) -> dict:
        """W and F measured now (between decode segments, outside their timing); for a run
        that streams, also F_io (the kernel while the disk streams) as a share of F."""
        w = self.reader.measure(depth=self.depth, seconds=self.segment_probe_s)
        f = F_fallback
        io_share = None
        if self.probe is not None:
            f = measure_kernel(self.probe, **self.kernel_args(self.llc_experts, self.threads, 1),
                               )["flops_per_s"]
            if streaming:
                io_share = self.kernel_while_reading(repeats=1)["flops_per_s"] / f
        # The compute term is the machine's: the faster of our kernel and llama.cpp's rate on
        # the same weights (measured in this run by the in-RAM peer pair, when --peer).
        return {"W": w["bytes_per_s"], "F": max(f or 0.0, self.F_peer) or f, "F_ours": f,
                "F_peer": self.F_peer or None, "F_io_share": io_share}

    def decode(self, files: list[Path], base: NativeOptions, fraction: float | None,
               args: argparse.Namespace, F_fallback: float | None) -> dict:
        """One decode run with W/F probes between its segments, charged the CPU share that
        other processes used meanwhile (the machine is shared)."""
        drop_page_cache(files)
        probes: list[dict] = []
        busy0, own0, steal0 = cpu_snapshot()
        started = time.perf_counter()
        run = decode_run(self.container, base, fraction=fraction, warmup=args.warmup,
                         tokens=args.tokens, segment=args.segment, seed=args.seed,
                         between=lambda i: probes.append(self.probe_now(F_fallback, fraction is not None)))
        probes.append(self.probe_now(F_fallback, fraction is not None))
        busy1, own1, steal1 = cpu_snapshot()
        wall = time.perf_counter() - started
        run["other_cpu_share"] = max(0.0, (busy1 - busy0) - (own1 - own0)) / (wall * self.threads)
        # Of which the hypervisor took (a VM's host doing our reads can steal our vCPUs).
        run["steal_cpu_share"] = max(0.0, steal1 - steal0) / (wall * self.threads)
        run["probes"] = probes
        return run


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small geometry, short probes (< 2 min)")
    ap.add_argument("--k3", action="store_true",
                    help="a Kimi K3-geometry container (synth --arch k3: MXFP4 experts, every K3 delta)")
    ap.add_argument("--out", type=Path, help="keep the container and write results.jsonl here")
    ap.add_argument("--budget-fraction", type=float, nargs="+", default=[0.1, 0.3],
                    help="cache sizes as fractions of all expert records (default 0.1 0.3)")
    ap.add_argument("--tokens", type=int, default=64, help="measured decode tokens (default 64)")
    ap.add_argument("--warmup", type=int, default=8, help="warm-up decode tokens (default 8)")
    ap.add_argument("--policy", choices=("layer", "lfru", "lru"), default="layer")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--io-threads", type=int, default=4,
                    help="libwaste reader threads (default 4; 0 = reads on the computing thread); "
                         "W is probed at this queue depth")
    ap.add_argument("--lookahead", action=argparse.BooleanOptionalAction, default=True,
                    help="decode router lookahead (default on; needs --io-threads >= 1)")
    ap.add_argument("--segment", type=int, default=8,
                    help="measured tokens between two W/F probes (default 8)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="decode runs per cache size (default 2, --quick 1)")
    ap.add_argument("--activations", choices=("f32", "q8"), default="q8",
                    help="libwaste's matvec activations (the server's default q8; f32 is the exact path)")
    ap.add_argument("--peer", action="store_true",
                    help="also run llama.cpp on the same weights (builds bench/.peer-venv once, ~15 min)")
    ap.add_argument("--peer-fraction", type=float, default=0.3,
                    help="the cache fraction whose budget (+ allowance) caps both engines (default 0.3)")
    ap.add_argument("--peer-allowance-mib", type=int, default=160,
                    help="cap = budget + this, for the Python process around each engine (default 160)")
    ap.add_argument("--peer-read-ahead-kb", type=int, default=None,
                    help="set the model disk's read-ahead for the peer runs, restored after "
                         "(machine-wide; default: leave it)")
    args = ap.parse_args(argv)
    if (args.tokens < 1 or args.segment < 1 or args.warmup < 0 or (args.repeat is not None and args.repeat < 1)
            or any(not 0 < f < 1 for f in args.budget_fraction) or not 0 < args.peer_fraction < 1
            or args.peer_allowance_mib < 0
            or (args.peer_read_ahead_kb is not None and args.peer_read_ahead_kb < 4)):
        ap.error("--tokens, --segment and --repeat must be ≥ 1, --warmup and --peer-allowance-mib ≥ 0, "
                 "--peer-read-ahead-kb ≥ 4 and every --budget-fraction and --peer-fraction in (0, 1)")
    if args.k3 and args.peer:
        ap.error("--peer runs Kimi-Linear weights only (llama.cpp's K3 path is not compared here): give --k3 or --peer")
    if args.repeat is None:
        args.repeat = 1 if args.quick else 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.k3:
        name = "k3-quick-h512" if args.quick else "k3-h1024"
        geometry, k3_options = K3_GEOMETRIES[name]
    else:
        name = "quick-h512" if args.quick else "kimi-linear-h1024"
        geometry, k3_options = GEOMETRIES[name], None
    threads = len(os.sched_getaffinity(0))
    rows: list[dict] = []
    emit_row = lambda row: emit(row, rows)  # noqa: E731
    workdir = args.out or Path(tempfile.mkdtemp(prefix="waste-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    bench = None
    try:
        models = None
        if args.peer:  # the same weights for both engines: synth checkpoint → ours and GGUF
            peer, peer_why = build_peer(build=True)
            started = time.perf_counter()
            models = prepare(name, geometry, workdir, peer, peer_why, threads)
            container, build_s = models.container, time.perf_counter() - started
        elif args.k3:
            container, build_s = k3_container_for(name, workdir, keep=args.out is not None)
        else:
            container, build_s = container_for(name, geometry, workdir, keep=args.out is not None)
        files = sorted(p for p in container.iterdir() if p.is_file())
        manifest = json.loads((container / "manifest.json").read_text())
        cfg, banks = manifest["config"], manifest["banks"]
        emit_row({"row": "env", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "cpu": platform.processor() or platform.machine(), "threads": threads,
                  "llc_bytes": llc_bytes(), "libwaste": library_build_info(),
                  "mode": "quick" if args.quick else "default",
                  "page_cache_drop": drop_page_cache(files), "policy": args.policy,
                  "io_threads": args.io_threads, "lookahead": bool(args.lookahead and args.io_threads),
                  "loadavg": os.getloadavg(), **source_state()})
        base = NativeOptions(ctx_tokens=PROMPT_TOKENS + args.warmup + args.tokens + 8,
                             usage_path="", n_threads=threads, cache_policy=args.policy,
                             io_threads=args.io_threads,
                             lookahead=int(args.lookahead and args.io_threads > 0),
                             activations=args.activations)
        plan = plan_memory(container, base)
        # params_active needs the weights: a full open at the floor budget (2·k slots).
        with NativeEngine.open(container, attrs.evolve(base, ram_budget_bytes=plan.floor_bytes)) as eng:
            info = eng.model_info()
        B_r = plan.working_set_bytes  # L_m · k · s_e
        emit_row({"row": "container", "geometry": name, **attrs.asdict(geometry),
                  **({"k3": attrs.asdict(k3_options), "arch": manifest["arch"],
                      "expert_format": banks[0]["format"], "trunk_format": manifest["quant"]["trunk"]}
                     if k3_options else {}),
                  "vocab": info.vocab, "moe_layers": len(banks), "record_bytes": plan.record_bytes,
                  "records": plan.expert_bytes // plan.record_bytes,
                  "expert_bytes": plan.expert_bytes, "trunk_bytes": plan.trunk_bytes,
                  "floor_bytes": plan.floor_bytes, "B_r": B_r,
                  "params_active": info.params_active, "params_total": info.params_total,
                  "build_s": round(build_s, 1), "kept": args.out is not None,
                  "source": "waste.tools.synth + waste.tools.convert" if args.peer
                  else "waste.tools.synth --arch k3 + waste.tools.convert" if args.k3
                  else "waste.tools.make_container"})
        bench = Bench(container, banks, plan.record_bytes, threads,
                      disk_s=1.5 if args.quick else 4.0, probe_s=0.3 if args.quick else 0.5,
                      segment_probe_s=0.3 if args.quick else 0.5,
                      reader=BankReader(container, banks), depth=max(1, args.io_threads),
                      activations=args.activations)
        M, F0 = bench.machine(workdir, emit_row)
        position = PROMPT_TOKENS + args.warmup + args.tokens / 2
        C = 2 * info.params_active + attention_flops(cfg, position)
        embed = next(t for t in manifest["tensors"] if t["name"] == "embed")
        B_d = resident_read_bytes(cfg, plan.trunk_bytes, embed["length"] // info.vocab, position)

        if F0 is None:
            # No kernel probe: F from one all-cached decode (so that run's compute ratio is
            # 1 by construction, and the row says so).
            cached = decode_run(container, base, fraction=None, warmup=args.warmup,
                                tokens=args.tokens, segment=args.segment, seed=args.seed)
            F0 = C * cached["tok_per_s"]
            emit_row({"row": "F_derived", "flops_per_s": F0, "source":
                      f"C × tok/s of an all-cached decode (kernel probe unavailable: "
                      f"{bench.probe_note}); the all-cached compute ratio is 1 by construction"})
        if args.peer and models.gguf is not None:
            # In RAM first: both engines warm and uncapped; llama.cpp's tok/s there gives the
            # machine's compute rate on this format (C x tok/s), which the bounds below use
            # when it beats our kernel probe.
            ram = in_ram(models, peer, budget=budget_for(container, base, None)[0],
                         prompt=prompt_ids(info.n_base_vocab, PROMPT_TOKENS, args.seed),
                         warmup=args.warmup, tokens=args.tokens, threads=threads, repeat=args.repeat,
                         options=base, C=C)
            emit_row(ram)
            if ram.get("status") == "measured":
                bench.F_peer = ram["F_peer"]
        runs = []
        for fraction in [None, *sorted(args.budget_fraction)]:
            for repeat in range(args.repeat):
                runs.append({**bench.decode(files, base, fraction, args, F0), "repeat": repeat})
        reference = runs[0]["token_ids"]
        for run in runs:
            same = run.pop("token_ids") == reference
            run.update({"C_flops": C, "B_d": B_d, "B_r": B_r, "M": M,
                        "working_set_records": B_r // plan.record_bytes,
                        "same_tokens_as_all_cached": same})
            run.update(bound_terms(run, M=M, B_r=B_r, B_d=B_d, C=C))
            run["segment_list"] = [attrs.asdict(seg) for seg in run["segment_list"]]
            emit_row(run)
        if not args.peer:
            emit_row(PEER_ROW)
        elif models.gguf is None:
            emit_row(unavailable(models.why))
        else:
            budget, _ = budget_for(container, base, args.peer_fraction)
            emit_row(compare(models, peer, budget=budget, fraction=args.peer_fraction,
                             allowance=args.peer_allowance_mib << 20,
                             prompt=prompt_ids(info.n_base_vocab, PROMPT_TOKENS, args.seed),
                             warmup=args.warmup, tokens=args.tokens, threads=threads,
                             repeat=args.repeat, policy=args.policy, options=base,
                             read_ahead_kb_wanted=args.peer_read_ahead_kb))
        print()
        for line in table(rows):
            print("# " + line if line else "#")
        if args.out:
            with open(args.out / "results.jsonl", "w") as f:
                for row in rows:
                    f.write(json.dumps(row, default=_json_default) + "\n")
    finally:
        if bench is not None:
            bench.reader.close()
        if args.out is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
