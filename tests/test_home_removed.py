"""A daemon whose home was deleted, or whose socket was removed or taken over, can be
reached by no client: it notices within seconds and stops as any stop does, leaving its
running jobs to their shims, and never removes a newer daemon's socket (issue 32). Real
daemons, the real CLI."""

from __future__ import annotations

import shutil

import psutil
import pytest

from conftest import Home, is_gone, wait_until

pytestmark = pytest.mark.e2e

GONE_WITHIN_S = 30.0  # the loop looks every 5 s


def test_a_daemon_whose_socket_was_removed_stops_and_its_job_runs_on(home: Home):
    job = home.submit("--", "sleep", "300")
    home.wait_state(job, "running")
    pid = home.daemon_pid()
    (home.path / "run" / "gpusched.sock").unlink()
    wait_until(lambda: is_gone(pid), "the daemon to stop", GONE_WITHIN_S)
    log = (home.state / "daemon.log").read_text()
    assert "gpusched.sock is gone: no client can reach this daemon any more; stopping" in log
    # Its job ran on under its shim; the next daemon adopts it.
    assert home.show(job)["state"] == "running"
    assert home.daemon_pid() != pid


def test_a_daemon_whose_home_was_deleted_stops_and_leaves_the_new_one_alone(tmp_path):
    old, new = Home(tmp_path / "home"), Home(tmp_path / "home")
    old.write_config()
    try:
        old_pid = old.start()
        old_procs = [psutil.Process(old_pid)]
        shutil.rmtree(old.path)
        # A new daemon at the same path, before the old one noticed.
        new.write_config()
        new_pid = new.start()
        assert new_pid != old_pid
        wait_until(lambda: is_gone(old_pid), "the old daemon to stop", GONE_WITHIN_S)
        # Its stop removed nothing of the new daemon's: the socket still answers.
        assert (new.path / "run" / "gpusched.sock").exists()
        assert new.daemon_pid() == new_pid
        assert new.submit("--hold", "--", "true") == 1
    finally:
        for proc in old_procs:
            if not is_gone(proc):
                proc.kill()
        new.cleanup()
