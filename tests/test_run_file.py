"""A run's record file: written by the job's shim, read by the daemon.

Real shims, run by hand (`python -I -S shim.py RUN_FILE`, which takes the spec from the
run file), in temporary jobs directories; no daemon.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import find_shim, wait_until
from gpusched.proc import runfile, runreport, shim

SHIM = Path(shim.__file__)


def _spec(tmp_path: Path, command: list[str], env: dict | None = None) -> dict:
    return {
        "job_id": 1,
        "run_file": runfile.run_file(tmp_path / "jobs", 1),
        "command": command,
        "env": env or {"PATH": os.defpath},
        "cwd": str(tmp_path),
        "stdout": str(tmp_path / "out.log"),
        "stderr": str(tmp_path / "err.log"),
        "grace_s": 1.0,
        "wake": str(tmp_path / "wake"),
        "cpu_ids": [],
        "cgroup": "",
        "run_as": None,
    }


def _write_spec(spec: dict) -> Path:
    """A run file as a shim that was stopped before its job started would leave it."""
    run_file = Path(spec["run_file"])
    run_file.parent.mkdir(parents=True, exist_ok=True)
    run_file.write_text(json.dumps({"record": "spec", **spec}) + "\n")
    return run_file


def _run_shim(spec: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-I", "-S", str(SHIM), str(_write_spec(spec))], start_new_session=True
    )


@pytest.mark.e2e
def test_a_shim_records_its_pid_and_the_jobs_end_and_wakes_the_daemon(tmp_path):
    jobs = tmp_path / "jobs"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as wake:
        wake.bind(str(tmp_path / "wake"))
        wake.settimeout(30)
        gate = tmp_path / "go"
        proc = _run_shim(
            _spec(
                tmp_path, ["sh", "-c", f"echo hi; until [ -e {gate} ]; do sleep 0.05; done; exit 3"]
            )
        )
        try:
            found = wait_until(lambda: find_shim(jobs, 1), "the shim's record")
            assert found == (proc.pid, psutil.Process(proc.pid).create_time())
            assert runfile.read_run(jobs, 1).exit is None  # still running
            gate.touch()
            assert wake.recv(16) == b"!"
            assert proc.wait(timeout=30) == 0
        finally:
            proc.kill()
            proc.wait()
    record = runfile.read_run(jobs, 1).exit
    assert (record.exit_code, record.signal, record.error) == (3, None, "")
    assert (tmp_path / "out.log").read_text() == "hi\n"
    run_file = jobs / "0000" / "1.run.jsonl"  # in its id range's directory, none of its own
    kinds = [json.loads(line)["record"] for line in run_file.read_text().splitlines()]
    assert kinds == ["spec", "shim", "exit"]
    runfile.clear_run(jobs, 1)
    assert not run_file.exists()
    assert runfile.read_run(jobs, 1) == runfile.RunState(None, None)


def test_a_run_file_cleared_for_a_retry_as_the_shim_ends_is_no_failure(tmp_path, monkeypatch):
    """The daemon may read the exit record and clear the run file for the job's retry as
    soon as the wake-up arrives, before the shim has flushed the record to disk. That
    flush failing must not fail the shim: the launcher would report "the shim failed",
    and the daemon would end the retry it had just launched with that reason."""
    spec = _spec(tmp_path, ["true"])
    run_file = _write_spec(spec)
    monkeypatch.setattr(runreport, "notify_daemon", lambda spec, message=b"!": run_file.unlink())
    runreport.record_exit(str(run_file), spec, runfile.ExitRecord(1, None, time.time()))
    assert not run_file.exists()


@pytest.mark.e2e
def test_the_exit_record_is_found_behind_a_long_spec_and_in_any_order(tmp_path):
    """A spec far longer than the tail the daemon reads, and a stray "shim" record after
    the exit record: the daemon finds the exit record all the same."""
    jobs = tmp_path / "jobs"
    proc = _run_shim(_spec(tmp_path, ["true"], env={"PATH": os.defpath, "BIG": "x" * 100_000}))
    assert proc.wait(timeout=30) == 0
    runfile.append_record(runfile.run_file(jobs, 1), "shim", {"pid": 1, "start_ticks": 0})
    record = runfile.read_run(jobs, 1).exit
    assert (record.exit_code, record.error) == (0, "")
    # The first record is the real shim's, and it has ended: no process matches it.
    assert find_shim(jobs, 1) == (proc.pid, 0.0)


def test_a_half_written_line_is_not_an_exit_record(tmp_path):
    jobs = tmp_path / "jobs"
    run_file = _write_spec(_spec(tmp_path, ["true"]))
    with run_file.open("a") as fh:
        fh.write('{"record": "exit", "exit_code": 0, "sig')  # a crash mid-write
    assert runfile.read_run(jobs, 1).exit is None
    assert find_shim(jobs, 1) is None


@pytest.mark.e2e
def test_proc_stat_is_read_past_a_process_name_with_spaces_and_parentheses(tmp_path):
    """A job names its processes as it likes (here through a link's name); the shim finds
    its descendants, the daemon its shim, and `top` CPU and memory, by the fields after it."""
    odd = tmp_path / "a) (b c"
    odd.symlink_to(shutil.which("sleep"))
    proc = subprocess.Popen([str(odd), "300"])
    try:
        found = psutil.Process(proc.pid)
        # Asleep in sleep(1) itself, past the exec and the loader: it has memory, CPU time.
        wait_until(
            lambda: found.name() == "a) (b c" and found.status() == "sleeping",
            "the process to take its odd name and sleep",
        )
        stat = runfile.read_proc_stat(proc.pid)
        assert stat.ppid == os.getpid()
        started_at = psutil.boot_time() + stat.start_ticks / os.sysconf("SC_CLK_TCK")
        assert abs(started_at - found.create_time()) < 0.05
        # Resident, and less than its address space (the field before, in bytes).
        assert 0 < stat.rss_pages * os.sysconf("SC_PAGE_SIZE") < found.memory_info().vms
        ticks = os.sysconf("SC_CLK_TCK")
        cpu = found.cpu_times()
        assert (stat.utime_ticks / ticks, stat.stime_ticks / ticks) == (cpu.user, cpu.system)
        assert runfile.read_proc_stat().ppid == os.getppid()  # "self"
    finally:
        proc.kill()
        proc.wait()


def test_a_launch_failure_datagram_names_its_job_and_a_plain_wake_does_not():
    reason = "cannot create its run file: [Errno 21] Is a directory: '/x/3.run.jsonl'"
    assert runfile.parse_launch_failure(runfile.launch_failure(3, reason)) == (3, reason)
    assert runfile.parse_launch_failure(runfile.WAKE) is None
