"""The machine's side of the docs/ENGINE.md §8 bound: W (record reads), M (RAM stream), F (kernel).

Each ``measure_*`` returns a plain dict that becomes one JSON line. ``drop_page_cache``
evicts files from the page cache and says how it did so.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np

NATIVE = Path(__file__).resolve().parents[1] / "native"
KERNEL_SOURCES = ("kernels.c", "kernels_x86.c", "numerics.c", "util.c")


def drop_page_cache(paths: list[Path]) -> dict:
    """``POSIX_FADV_DONTNEED`` on every file, then ``echo 1 > /proc/sys/vm/drop_caches``.

    Returns what worked: {"fadvise_files": n, "drop_caches": "ok" | the error}.
    """
    os.sync()
    done = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            done += 1
        finally:
            os.close(fd)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        dropped = "ok"
    except OSError as exc:
        dropped = f"failed: {exc.strerror or exc}"
    return {"fadvise_files": done, "drop_caches": dropped}


def _open_bank(path: Path, record_bytes: int) -> tuple[int, str]:
    """An fd for ``path`` and its mode: "o_direct", or "buffered+fadvise_dontneed" when the
    filesystem refuses O_DIRECT (probed with one aligned record read, as the engine does)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
    else:
        probe = mmap.mmap(-1, record_bytes)
        try:
            if os.preadv(fd, [probe], 4096) == record_bytes:
                return fd, "o_direct"
        except OSError:
            pass
        finally:
            probe.close()
        os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    return fd, "buffered+fadvise_dontneed"


class BankReader:
    """The container's expert banks opened once for W probes (O_DIRECT where possible)."""

    def __init__(self, container: Path, banks: list[dict]) -> None:
        self.banks = banks
        self.record = max(b["record_bytes"] for b in banks)
        self.fds: list[int] = []
        self.modes: list[str] = []
        try:
            for bank in banks:
                fd, mode = _open_bank(container / bank["file"], bank["record_bytes"])
                self.fds.append(fd)
                self.modes.append(mode)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def measure(self, *, depth: int, seconds: float | None = None,
                stop: threading.Event | None = None, seed: int = 7) -> dict:
        """W: random record-sized reads at bank offsets ``4096 + e·record_bytes``.

        ``depth`` threads each issue one ``pread`` at a time (the engine's ``io_threads``
        readers do the same), for ``seconds`` or until ``stop`` is set.
        """
        if (seconds is None) == (stop is None):
            raise ValueError("measure needs exactly one of seconds and stop")
        totals = [0] * depth
        reads = [0] * depth
        deadline = time.perf_counter() + seconds if seconds is not None else None

        def done() -> bool:
            return stop.is_set() if stop is not None else time.perf_counter() >= deadline

        def reader(slot: int) -> None:
            rng = np.random.default_rng([seed, slot, time.monotonic_ns()])
            buf = mmap.mmap(-1, self.record)  # page-aligned, as O_DIRECT needs
            try:
                while True:
                    b = int(rng.integers(len(self.banks)))
                    bank, fd = self.banks[b], self.fds[b]
                    size = bank["record_bytes"]
                    offset = 4096 + int(rng.integers(bank["n_experts"])) * size
                    view = memoryview(buf)[:size]
                    got = os.preadv(fd, [view], offset)
                    view.release()
                    if got != size:
                        raise OSError(f"{bank['file']}: short read {got} of {size} at {offset}")
                    if self.modes[b] != "o_direct":
                        os.posix_fadvise(fd, offset, size, os.POSIX_FADV_DONTNEED)
                    totals[slot] += size
                    reads[slot] += 1
                    if done():
                        return
            finally:
                buf.close()

        start = time.perf_counter()
        threads = [threading.Thread(target=reader, args=(i,)) for i in range(depth)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        modes = set(self.modes)
        mode = "o_direct" if modes == {"o_direct"} else "+".join(sorted(modes))
        return {"row": "W", "depth": depth, "mode": mode, "record_bytes": self.record,
                "reads": sum(reads), "seconds": round(elapsed, 3),
                "bytes_per_s": sum(totals) / elapsed,
                "ms_per_read": 1000 * elapsed * depth / max(sum(reads), 1)}


def measure_kernel_while_reading(probe: Path, reader: BankReader, *, depth: int, **kernel_args) -> dict:
    """F_io: the kernel probe's rate while ``depth`` threads stream records from the banks,
    as the engine's readers do while it computes.

    On a VM the host may serve the guest's reads on the cores that run its vCPUs: then the
    same kernel computes slower while the disk is busy (seen here: −30 to −40 % at
    ~1.2 GB/s, with the lost time showing up as steal). ``W_during`` is what the disk read
    meanwhile (over the probe's whole run, its set-up included)."""
    stop = threading.Event()
    during: dict = {}
    failed: list[BaseException] = []

    def stream() -> None:
        try:
            during.update(reader.measure(depth=depth, stop=stop))
        except BaseException as exc:  # re-raised on the caller's thread below
            failed.append(exc)

    streamer = threading.Thread(target=stream)
    streamer.start()
    try:
        row = measure_kernel(probe, **kernel_args)
    finally:
        stop.set()
        streamer.join()
    if failed:
        raise failed[0]
    return {**row, "row": "F_io", "read_depth": depth, "W_during": during["bytes_per_s"]}


def llc_bytes() -> int:
    """The largest CPU cache listed in sysfs (the LLC), or 32 MiB when sysfs says nothing."""
    best = 0
    for size in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = size.read_text().strip()
        scale = {"K": 1024, "M": 1 << 20}.get(text[-1:], 1)
        best = max(best, int(text.rstrip("KM")) * scale)
    return best or 32 << 20


def measure_ram(*, threads: int, buffer_bytes: int, passes: int = 3) -> dict:
    """M: the best of ``passes`` streaming reads (numpy float32 ``max``, which releases the
    GIL) over ``buffer_bytes``, split across ``threads`` Python threads."""
    data = np.ones(buffer_bytes // 4, dtype=np.float32)
    parts = np.array_split(data, threads)
    best = 0.0
    for _ in range(passes):
        workers = [threading.Thread(target=np.max, args=(part,)) for part in parts]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = max(best, data.nbytes / (time.perf_counter() - start))
    del parts, data
    return {"row": "M", "threads": threads, "buffer_bytes": buffer_bytes,
            "method": "numpy float32 max, best of %d" % passes, "bytes_per_s": best}


def build_kernel_probe(workdir: Path) -> tuple[Path | None, str]:
    """Compile ``bench/matvec_rate.c`` with libwaste's own kernel sources (read, not copied).

    Returns (binary, the compiler command), or (None, why) when there is no compiler. A
    compiler that cannot build the probe is an error, not a fallback: the probe compiles
    against libwaste's internal kernel API, and a stale probe must be fixed, not worked around.
    """
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler found (set CC)"
    out = workdir / "matvec_rate"
    cmd = [cc, "-std=c11", "-D_GNU_SOURCE", "-O2", "-pthread",
           f"-I{NATIVE / 'include'}", f"-I{NATIVE / 'src'}",
           str(Path(__file__).with_name("matvec_rate.c")),
           *[str(NATIVE / "src" / name) for name in KERNEL_SOURCES], "-lm", "-o", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"bench/matvec_rate.c does not compile against native/src "
                           f"(fix the probe):\n{result.stderr.strip()[:2000]}")
    return out, " ".join(Path(cmd[0]).name if i == 0 else a for i, a in enumerate(cmd))


def measure_kernel(probe: Path, *, fmt: str, group: int, hidden: int, moe_inter: int,
                   experts: int, threads: int, seconds: float, repeats: int = 3,
                   activations: str = "f32") -> dict:
    """F: the best of ``repeats`` runs of the matvec probe over ``experts`` resident experts."""
    best: dict | None = None
    for _ in range(repeats):
        out = subprocess.run([str(probe), fmt, str(group), str(hidden), str(moe_inter),
                              str(experts), str(threads), str(seconds), activations],
                             capture_output=True, text=True, check=True)
        row = json.loads(out.stdout)
        if best is None or row["flops_per_s"] > best["flops_per_s"]:
            best = row
    assert best is not None
    best.pop("sink", None)
    return {"row": "F", **best}
