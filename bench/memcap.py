"""A memory cap for one benchmark process: a cgroup v1 memory group (docs/ENGINE.md §8).

On this machine kind cgroup v2 ``memory.max`` and ``systemd-run`` are unavailable; the v1
memory controller works. ``MemoryCap.create(limit)`` makes a child group under this
process's own memory cgroup and writes ``memory.limit_in_bytes``; a process joins it by
writing its pid to ``cgroup.procs`` (``join``: the benchmark child does that first thing,
before it loads a model). Page-cache pages of the model files count against the limit, so
a capped engine that mmaps its weights has to re-read them from disk. ``close`` removes the
group after its processes have exited. When the group cannot be made (no v1 controller, not
root, read-only), ``MemoryCap.create`` raises ``CapUnavailable`` saying why, and the caller
says so in its row instead of pretending to have capped anything.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

V1_ROOT = Path("/sys/fs/cgroup/memory")


class CapUnavailable(Exception):
    """No cgroup v1 memory group could be made here; the message says why."""


def own_memory_cgroup() -> Path:
    """The v1 memory cgroup directory this process is in."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return V1_ROOT / path.lstrip("/")
    raise CapUnavailable("/proc/self/cgroup lists no v1 memory controller")


@attrs.define
class MemoryCap:
    """A child memory group with ``limit_bytes``; ``path`` is its directory."""

    path: Path
    limit_bytes: int

    @classmethod
    def create(cls, limit_bytes: int, name: str) -> "MemoryCap":
        parent = own_memory_cgroup()
        if not (parent / "memory.limit_in_bytes").exists():
            raise CapUnavailable(f"{parent} is not a cgroup v1 memory group")
        path = parent / name
        try:
            path.mkdir(exist_ok=True)
            (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        except OSError as exc:
            raise CapUnavailable(f"cannot create the memory group {path}: {exc}") from None
        got = int((path / "memory.limit_in_bytes").read_text())
        if abs(got - limit_bytes) > 4096:  # the kernel rounds to pages
            raise CapUnavailable(f"{path}: wrote limit {limit_bytes}, the kernel kept {got}")
        return cls(path=path, limit_bytes=got)

    def usage(self) -> dict:
        """Peak usage, how often the limit was hit, and the group's page-cache/RSS split."""
        stat = dict(line.split() for line in (self.path / "memory.stat").read_text().splitlines())
        return {"max_usage_bytes": int((self.path / "memory.max_usage_in_bytes").read_text()),
                "limit_hits": int((self.path / "memory.failcnt").read_text()),
                "cache_bytes": int(stat.get("cache", 0)), "rss_bytes": int(stat.get("rss", 0)),
                "pgmajfault": int(stat.get("total_pgmajfault", stat.get("pgmajfault", 0)))}

    def close(self) -> None:
        """Removes the group (its processes have exited; leftover charges move to the parent)."""
        try:
            (self.path / "memory.force_empty").write_text("0")
        except OSError:
            pass
        try:
            self.path.rmdir()
        except OSError:
            pass


def join(group: str | Path) -> None:
    """Moves the calling process into ``group`` (a cgroup v1 directory)."""
    (Path(group) / "cgroup.procs").write_text(str(os.getpid()))
