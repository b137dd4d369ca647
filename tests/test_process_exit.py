"""A process that has exited but is not reaped yet (a zombie) counts as ended: `daemon stop`
and the tests' clean-up must not wait for a parent that reaps late, or never."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from conftest import wait_until
from gpusched.client.connection import is_running, wait_for_exit
from processes import is_gone, kill_all

pytestmark = pytest.mark.e2e

NEVER_REAPS = """
import os, time
child = os.fork()
if child == 0:
    os._exit(0)
print(child, flush=True)
time.sleep(60)
"""


def _zombie() -> tuple[subprocess.Popen, int]:
    """A child that exits at once, of a parent that never reaps it. (Not a shell's `sleep 0 &`
    before `exec sleep`: on a busy machine the shell could reap it before its exec.)"""
    parent = subprocess.Popen(
        [sys.executable, "-c", NEVER_REAPS], stdout=subprocess.PIPE, text=True
    )
    pid = int(parent.stdout.readline())
    wait_until(
        lambda: psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, "the unreaped child to exit"
    )
    return parent, pid


def test_daemon_stop_counts_an_unreaped_exited_process_as_gone():
    parent, pid = _zombie()
    try:
        assert not is_running(pid)
        assert wait_for_exit(pid, timeout_s=30.0)
        assert psutil.pid_exists(pid)  # still there, as a zombie: only its state said so
    finally:
        kill_all([psutil.Process(parent.pid)])
        parent.wait()


def test_a_live_process_is_running_and_the_cleanup_ends_it():
    proc = subprocess.Popen(["sleep", "60"])
    assert is_running(proc.pid) and not is_gone(proc.pid)
    kill_all([psutil.Process(proc.pid)])
    assert is_gone(proc.pid)  # killed, and reaped by is_gone since it is ours
    assert not psutil.pid_exists(proc.pid)
