"""Usage errors the engine would find only after binding are said first (issue 11, minor):
``--threads 2 --cpus 1`` exits 2 before "listening on" is printed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from waste.app.settings import UsageError, load_settings


def test_threads_over_the_cpu_list_is_a_usage_error_before_binding():
    proc = subprocess.Popen([sys.executable, "-m", "waste", "--fake-engine", "--port", "0",
                             "--threads", "2", "--cpus", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()  # "" once it exits; the old server printed listening
        assert not first.startswith("listening on"), first
        assert proc.wait(30) == 2
        assert "--threads 2 exceeds the 1 CPUs of --cpus 1" in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize("threads,cpus,ok", [(2, "0-1", True), (3, "0-1", False),
                                             (4, "0,2,4-5", True), (1, "3-1", False),
                                             (8, None, True)])
def test_threads_fit_the_cpu_list(threads, cpus, ok):
    argv = ["--fake-engine", "--threads", str(threads)] + (["--cpus", cpus] if cpus else [])
    if ok:
        assert load_settings(argv, {}).threads == threads
    else:
        with pytest.raises(UsageError):
            load_settings(argv, {})
