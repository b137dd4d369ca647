"""`submit --pty` and `gpusched attach`, through the CLI on real daemons (the attacher's
stdin a pipe here; tests/test_attach_tmux.py drives a real terminal): the job's exit status
comes back through attach however it ends, attach outlives the daemon, and a job without
--pty says how to follow it instead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from conftest import Home, wait_until

pytestmark = pytest.mark.e2e

# Prints a prompt, echoes back what it is told, ends with the code it is given.
PROMPTER = (
    "import sys\n"
    "print('tty' if sys.stdin.isatty() else 'no tty', flush=True)\n"
    "while True:\n"
    "    line = input('ask> ')\n"
    "    if line.startswith('exit '):\n"
    "        sys.exit(int(line[5:]))\n"
    "    print('got', line[::-1], flush=True)\n"
)


class Attacher:
    """`gpusched attach ID` with pipes for its stdin, stdout and stderr."""

    def __init__(self, home: Home, job_id: int, *args: str, stdin: Any = subprocess.PIPE):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpusched", "attach", *args, str(job_id)],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=home.env,
            cwd=home.path,
        )
        self.out, self.err = bytearray(), bytearray()
        self.readers = [
            threading.Thread(target=self._read, args=(pipe, into), daemon=True)
            for pipe, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for reader in self.readers:
            reader.start()

    def _read(self, pipe: Any, into: bytearray) -> None:
        while chunk := os.read(pipe.fileno(), 4096):
            into += chunk

    def type(self, keys: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(keys)
        self.proc.stdin.flush()

    def wait_for(self, text: bytes, what: str) -> None:
        wait_until(lambda: text in self.out, f"{what} ({text!r}) in attach's output")

    def end(self) -> tuple[int, str]:
        """attach's exit status and its stderr, once it has exited."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        for reader in self.readers:
            reader.join(10)
        return self.proc.returncode, self.err.decode()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def attachers():
    made: list[Attacher] = []
    yield made
    for attacher in made:
        attacher.kill()


def prompter(home: Home, *options: str) -> int:
    job = home.submit("--pty", *options, "--", "python3", "-c", PROMPTER)
    home.wait_state(job, "running")
    return job


def test_a_prompt_is_answered_through_attach_and_its_exit_code_comes_back(home, attachers):
    home.start()
    job = prompter(home)
    attach = Attacher(home, job)
    attachers.append(attach)
    attach.wait_for(b"ask> ", "the prompt")
    attach.type(b"olleh\n")
    attach.wait_for(b"got hello", "the job's answer")
    attach.type(b"exit 7\n")
    status, err = attach.end()
    assert (status, err) == (7, f"[job {job} exited with code 7]\n")
    assert home.wait_state(job, "failed")["exit_code"] == 7
    # The job had a terminal; its log keeps what the terminal showed, its control
    # characters too, and --plain leaves them out.
    raw = subprocess.run(
        [sys.executable, "-m", "gpusched", "logs", str(job)],
        env=home.env,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    assert b"tty\r\n" in raw and b"got hello\r\n" in raw
    plain = home.run("logs", "--plain", str(job)).stdout
    assert plain.startswith("tty\nask> olleh\ngot hello\n"), plain


def test_detach_leaves_the_job_running_and_attach_again_shows_the_scrollback(home, attachers):
    home.start()
    job = prompter(home)
    first = Attacher(home, job)
    attachers.append(first)
    first.wait_for(b"ask> ", "the prompt")
    first.type(b"eno\n")
    first.wait_for(b"got one", "the answer")
    first.type(b"\x1d")  # ctrl-], the default detach key
    status, err = first.end()
    assert status == 0 and f"detached from job {job}" in err
    assert home.show(job)["state"] == "running"
    # Two attached at once, the second with docker's keys: both see the scrollback and
    # what either types; the second's ctrl-p alone is a key for the job, not a detach.
    again = Attacher(home, job)
    other = Attacher(home, job, "--detach-keys", "ctrl-p,ctrl-q")
    attachers.extend([again, other])
    again.wait_for(b"got one", "the scrollback")
    other.wait_for(b"got one", "the scrollback")
    other.type(b"owt\n")
    again.wait_for(b"got two", "the other attacher's answer")
    other.type(b"\x10\x11")
    assert other.end()[0] == 0
    again.type(b"exit 0\n")
    assert again.end() == (0, f"[job {job} exited with code 0]\n")
    assert home.wait_state(job, "succeeded")


def test_attach_goes_on_across_a_daemon_kill_and_attaches_after_it(home, attachers):
    home.start()
    job = prompter(home)
    attach = Attacher(home, job)
    attachers.append(attach)
    attach.wait_for(b"ask> ", "the prompt")
    home.kill_daemon()
    attach.type(b"daer\n")
    attach.wait_for(b"got read", "an answer with no daemon")
    attach.type(b"\x1d")
    assert attach.end()[0] == 0
    # The next attach starts the daemon again, which re-adopted the job.
    again = Attacher(home, job)
    attachers.append(again)
    again.wait_for(b"got read", "the scrollback after the restart")
    again.type(b"exit 4\n")
    assert again.end()[0] == 4
    assert home.wait_state(job, "failed")["exit_code"] == 4


def test_attach_with_stdin_from_dev_null_watches_until_the_end(home, attachers, tmp_path):
    home.start()
    gate = tmp_path / "go"
    wait = f"echo waiting; while [ ! -e {gate} ]; do sleep 0.05; done; echo done; exit 6"
    job = home.submit("--pty", "--", "sh", "-c", wait)
    home.wait_state(job, "running")
    attach = Attacher(home, job, stdin=subprocess.DEVNULL)
    attachers.append(attach)
    attach.wait_for(b"waiting", "the scrollback")
    gate.touch()
    assert attach.end() == (6, f"[job {job} exited with code 6]\n")
    assert attach.out.endswith(b"done\r\n")


def test_a_pty_job_that_cannot_start_fails_as_any_other_and_leaves_no_socket(home):
    job = home.submit("--pty", "--", "./no-such-program")
    ended = home.wait_state(job, "failed")
    assert "cannot start" in ended["end_reason"], ended
    assert not Path(ended["stdout_path"]).with_name(f"{job}.pty.sock").exists()
    # attach ends with the job's status, as for any job that has ended.
    assert home.run("attach", str(job), check=False).returncode == ended["exit_code"]


def test_a_job_without_pty_says_to_follow_its_log_instead(home):
    job = home.submit("--", "sleep", "300")
    proc = home.run("attach", str(job), check=False)
    assert proc.returncode == 1
    assert proc.stderr == (
        f"Error: job {job} was not submitted with --pty, so it has no terminal to attach "
        f"to. Follow its output with: gpusched logs -f {job}\n"
    )


def test_cancel_ends_the_job_and_attach_with_sigterm(home, attachers):
    home.start()
    job = prompter(home)
    attach = Attacher(home, job)
    attachers.append(attach)
    attach.wait_for(b"ask> ", "the prompt")
    home.run("cancel", str(job))
    assert attach.end() == (128 + signal.SIGTERM, f"[job {job} was ended by SIGTERM]\n")
    assert home.wait_state(job, "cancelled")["signal"] == signal.SIGTERM


def test_a_time_limit_ends_a_pty_job_as_any_other(home, attachers):
    home.start()
    job = prompter(home, "--time", "2s")
    attach = Attacher(home, job)
    attachers.append(attach)
    status, err = attach.end()
    assert status == 128 + signal.SIGTERM, err
    assert home.wait_state(job, "timeout")["signal"] == signal.SIGTERM


def test_ctrl_c_typed_through_attach_is_the_jobs_sigint(home, attachers):
    home.start()
    job = home.submit("--pty", "--", "sleep", "300")
    home.wait_state(job, "running")
    attach = Attacher(home, job)
    attachers.append(attach)
    attach.type(b"\x03")  # the terminal's interrupt character, to its foreground group
    assert attach.end() == (128 + signal.SIGINT, f"[job {job} was ended by SIGINT]\n")
    ended = home.wait_state(job, "failed")
    assert (ended["exit_code"], ended["signal"]) == (None, signal.SIGINT)


def test_a_preempted_pty_job_runs_again_on_a_new_terminal(home, attachers):
    home.start()
    job = prompter(home, "--preemptible")
    attach = Attacher(home, job)
    attachers.append(attach)
    attach.wait_for(b"ask> ", "the prompt")
    home.run("preempt", str(job))
    status, _ = attach.end()
    assert status >= 128  # its first run ended by the preemption's signal
    wait_until(
        lambda: home.show(job)["attempt"] == 2 and home.show(job)["state"] == "running",
        "the second run",
    )
    again = Attacher(home, job)
    attachers.append(again)
    again.wait_for(b"ask> ", "the second run's prompt")
    again.type(b"exit 5\n")
    assert again.end()[0] == 5
    assert home.wait_state(job, "failed")["exit_code"] == 5


def test_attach_waits_for_a_pending_job_and_ends_at_once_for_an_ended_one(home, attachers):
    home.start()
    job = home.submit("--pty", "--hold", "--", "python3", "-c", PROMPTER)
    attach = Attacher(home, job)
    attachers.append(attach)
    wait_until(lambda: b"has not started yet" in attach.err, "attach to say it waits")
    home.run("release", str(job))
    attach.wait_for(b"ask> ", "the prompt once the job runs")
    attach.type(b"exit 3\n")
    status, err = attach.end()
    assert status == 3, err
    later = home.run("attach", str(job), check=False)
    assert later.returncode == 3
    assert f"[job {job} exited with code 3; its output: gpusched logs {job}]" in later.stderr
    never = home.submit("--pty", "--hold", "--", "true")
    home.run("cancel", str(never))
    unrun = home.run("attach", str(never), check=False)
    assert (unrun.returncode, unrun.stderr) == (
        1,
        f"[job {never} is cancelled; gpusched show {never}]\n",
    )


def test_a_thousand_short_pty_jobs_keep_their_exit_codes(home, tmp_path):
    lines = tmp_path / "jobs.txt"
    lines.write_text("".join(f"exit {i % 250}\n" for i in range(1000)))
    home.start()
    first = home.json("submit", "--pty", "--from-file", str(lines))["ids"][0]
    ids = range(first, first + 1000)
    wait_until(
        lambda: not [j for j in home.jobs() if j["state"] in ("pending", "running")],
        "the thousand jobs to end",
        timeout=300,
    )
    codes = {j["id"]: j["exit_code"] for j in home.jobs()}
    assert [codes[i] for i in ids] == [i % 250 for i in range(1000)]


def test_a_pty_jobs_log_keeps_under_the_cap_and_attach_still_sees_the_end(home, attachers):
    home.write_config('[jobs]\nmax_log_size = "4K"\n')
    home.start()
    job = home.submit("--pty", "--", "sh", "-c", "read go; seq -f 'line %g' 1 20000; exit 2")
    home.wait_state(job, "running")
    attach = Attacher(home, job)
    attachers.append(attach)
    attach.type(b"go\n")
    assert attach.end()[0] == 2
    assert b"line 20000\r\n" in attach.out
    log = home.run("logs", "--plain", str(job)).stdout
    assert log.startswith("[gpusched: ") and log.endswith("line 20000\n"), log[:200]
    assert Path(home.show(job)["stdout_path"]).stat().st_size <= 4096
