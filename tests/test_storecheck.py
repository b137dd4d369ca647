"""A damaged queue is refused, not taken for an empty one: each way a queue file breaks is
told apart in one line that names the file and what to do, and no file changes a byte."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from queue_damage import VARIANTS, fingerprint, place


def one_error_line(proc: subprocess.CompletedProcess, log_before: bool = False) -> str:
    """The command's one `Error:` line. log_before: the foreground daemon (`daemon run`, as
    systemd runs it) may log details first, on the same stream: its log."""
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert proc.stderr.endswith("\n") and lines[-1].startswith("Error: "), proc.stderr
    assert [line for line in lines if line.startswith("Error: ")] == lines[-1:], proc.stderr
    assert log_before or len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    return lines[-1]


@pytest.mark.parametrize("name, base, spoil, words", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_a_damaged_queue_is_refused_in_one_line_and_left_byte_identical(
    bases, make_home, name, base, spoil, words
):
    home = make_home("2x80GiB")
    state = place(bases[base], home)
    spoil(state)
    before = fingerprint(state)
    db = str(state / "queue.db")
    # Any command starts the daemon; the daemon refuses, and the command says why.
    for args in (("ls",), ("daemon", "run")):
        line = one_error_line(home.run(*args, check=False, timeout=60), args[0] == "daemon")
        assert words in line and db in line and "gpusched doctor" in line, (args, line)
        assert "internal error" not in line and "Move it aside to start" not in line
    assert home.run("daemon", "status", check=False).returncode == 3
    assert fingerprint(state) == before
    assert not (state / "elsewhere").exists()  # a dangling link's target is never created
    # The doctor explains the same, and exits 1.
    proc = home.run("doctor", check=False)
    assert proc.returncode == 1 and words in proc.stdout and "PROBLEM" in proc.stdout, proc.stdout
    report = json.loads(home.run("doctor", "--json", check=False).stdout)
    assert report["healthy"] is False
    assert any(words in f["message"] for f in report["findings"] if f["status"] == "problem")
    assert fingerprint(state) == before


def test_the_integrity_report_goes_whole_to_the_log(bases, make_home):
    home = make_home("2x80GiB")
    state = place(bases["clean"], home)
    from queue_damage import bad_page

    bad_page(state)
    line = one_error_line(home.run("ls", check=False))
    log = (state / "daemon.log").read_text()
    reported = [entry for entry in log.splitlines() if "queue.db: " in entry and "ERROR" in entry]
    assert reported, log
    if len(reported) > 1:
        assert f"{len(reported)} problems" in line and "daemon's log" in line


def test_a_crash_with_commits_in_the_wal_still_starts_and_keeps_them(bases, make_home):
    # The healthy case next to the variants: a -wal and -shm left by a SIGKILL are normal.
    home = make_home("2x80GiB")
    place(bases["crashed"], home)
    jobs = home.jobs()
    assert [j["id"] for j in jobs] == [1, 2, 3, 4, 5, 6, 7]
    assert home.submit("--", "true") == 8


def test_a_new_home_and_a_stray_shm_are_not_damage(bases, make_home):
    home = make_home("2x80GiB")
    assert home.submit("--", "true") == 1  # nothing there: a new queue, as ever
    other = make_home("2x80GiB")
    state = place(bases["clean"], other)
    # A -shm whose every frame was copied into the queue file: nothing was lost.
    (state / "queue.db-shm").write_bytes(b"\x00" * 32768)
    assert other.submit("--", "true") == 5


def test_an_unreadable_queue_is_not_called_corrupt(bases, make_home):
    # `sudo -u someone gpusched ...` once left the queue file owned by another user: the
    # file is intact, so the words must not say corrupt, nor advise moving it aside.
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to take away root's right to read any file")
    home = make_home("2x80GiB")
    state = place(bases["clean"], home)
    os.chown(state / "queue.db", 65534, 65534)
    os.chmod(state / "queue.db", 0o600)
    before = fingerprint(state)
    # Root without CAP_DAC_OVERRIDE reads as an ordinary user does: the daemon it starts too.
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    proc = subprocess.run(
        [*drop, sys.executable, "-m", "gpusched", "ls"],
        env=home.env,
        cwd=home.path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = one_error_line(proc)
    assert "cannot be read and written by uid 0" in line and "belongs to uid 65534" in line, line
    assert "corrupt" not in line and "do not move it aside" in line
    assert str(state / "queue.db") in line and "gpusched doctor" in line
    assert fingerprint(state) == before
