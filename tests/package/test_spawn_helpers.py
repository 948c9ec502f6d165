"""The suite's hang detector (tests/spawn_helpers.py): a child that sleeps is hung, one that computes slowly
is not, whatever the wall clock says."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from spawn_helpers import Progress, cpu_seconds

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="the CPU-time reading needs /proc")


def _watch(code: str, stall: float, seconds: float) -> bool:
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        progress, end = Progress(stall), time.monotonic() + seconds
        while time.monotonic() < end:
            if progress.hung([child.pid]):
                return True
            time.sleep(0.05)
        return False
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow
def test_a_sleeping_child_is_hung_after_the_stall_bound() -> None:
    assert _watch("import time; time.sleep(60)", stall=1.0, seconds=20.0)


@pytest.mark.slow
def test_a_computing_child_is_not_hung_however_long_it_takes() -> None:
    assert not _watch("while True: pass", stall=1.0, seconds=4.0)


def test_cpu_seconds_grow_with_work_and_ignore_exited_processes() -> None:
    before = cpu_seconds([os.getpid()])
    assert before is not None
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    after = cpu_seconds([os.getpid()])
    assert after is not None and after >= before + 0.1
    assert cpu_seconds([2**22 + 12345]) == 0.0  # no such process
