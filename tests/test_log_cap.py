"""[jobs] max_log_size end to end: real jobs writing more than the cap, read back with the
real CLI; `logs -f` across trims; the cap outlives the daemon; uncapped logs stay direct."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time

from conftest import DEADLINE_S, wait_until

CAP = 4096
CONFIG = '[jobs]\nmax_log_size = "4K"\n'


def lines(first: int, last: int) -> str:
    return "".join(f"line {i}\n" for i in range(first, last + 1))


def test_a_log_past_the_cap_keeps_its_newest_part_and_says_how_much_went(home):
    home.write_config(CONFIG)
    job_id = home.submit("--", "sh", "-c", "seq -f 'line %g' 1 20000; echo done >&2")
    home.wait_state(job_id, "succeeded")
    text = home.run("logs", str(job_id)).stdout
    mark, rest = text.split("\n", 1)
    dropped = len(lines(1, 20000)) - len(rest)
    assert mark == f"[gpusched: {dropped} earlier bytes dropped: max_log_size 4K]"
    assert rest.startswith("line ") and rest.endswith("line 19999\nline 20000\n")
    first = int(rest.split("\n", 1)[0].split()[1])
    assert rest == lines(first, 20000)  # whole lines, none lost after the cut
    assert len(text.encode()) <= CAP
    assert home.run("logs", "--stderr", str(job_id)).stdout == "done\n"


def test_an_uncapped_log_is_written_by_the_job_itself_and_a_capped_one_through_a_pipe(make_home):
    for config, kind in (("", "file"), (CONFIG, "pipe")):
        home = make_home()
        home.write_config(config)
        job_id = home.submit("--", "sh", "-c", "readlink /proc/self/fd/1")
        job = home.wait_state(job_id, "succeeded")
        target = home.run("logs", str(job_id)).stdout.strip()
        assert (target == job["stdout_path"]) == (kind == "file"), target
        assert target.startswith("pipe:") == (kind == "pipe"), target


BURSTS, PER_BURST = 30, 100


def burst_job(home) -> int:
    """A job that writes BURSTS bursts of lines, each after the test opens its gate."""
    script = (
        f"i=0; while [ $i -lt {BURSTS} ]; do "
        f'seq -f "line %g" $((i*{PER_BURST})) $((i*{PER_BURST}+{PER_BURST - 1})); '
        "while [ ! -e gate.$i ]; do sleep 0.02; done; i=$((i+1)); done"
    )
    return home.submit("--", "sh", "-c", script)


def open_gate(home, burst: int) -> None:
    (home.path / f"gate.{burst}").touch()


class Reader:
    """Lines of a process's stdout as they come, each awaited with a deadline."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.buffer = proc, b""
        self.selector = selectors.DefaultSelector()
        self.selector.register(proc.stdout, selectors.EVENT_READ)

    def until(self, line: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while (line + "\n").encode() not in self.buffer:
            left = deadline - time.monotonic()
            assert left > 0, f"no {line!r} in {self.buffer[-300:]!r}"
            if self.selector.select(left):
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                assert chunk, f"output ended before {line!r}"
                self.buffer += chunk


def test_logs_follow_keeps_its_place_across_trims(home):
    home.write_config(CONFIG)
    job_id = burst_job(home)
    follow = subprocess.Popen(
        [sys.executable, "-m", "gpusched", "logs", "-f", str(job_id)],
        stdout=subprocess.PIPE,
        env=home.env,
        cwd=home.path,
    )
    try:
        reader = Reader(follow)
        for burst in range(BURSTS):  # each burst is a quarter of the cap: many trims
            reader.until(f"line {burst * PER_BURST + PER_BURST - 1}")
            open_gate(home, burst)
        assert follow.wait(timeout=DEADLINE_S) == 0
        reader.buffer += follow.stdout.read()
    finally:
        follow.kill()
        follow.wait()
        follow.stdout.close()
    assert reader.buffer.decode() == lines(0, BURSTS * PER_BURST - 1)  # all, once, in order
    assert home.run("logs", str(job_id)).stdout.startswith("[gpusched: ")


def test_the_cap_holds_while_no_daemon_runs(home):
    home.write_config(CONFIG)
    job_id = burst_job(home)

    def log():
        return home.run("logs", str(job_id)).stdout

    wait_until(lambda: f"line {PER_BURST - 1}\n" in log(), "the first burst")
    home.kill_daemon()  # the shim, and the copying, go on
    for burst in range(BURSTS):
        open_gate(home, burst)
    stdout_path = home.state / "jobs" / "0000" / f"{job_id}.stdout.log"
    last = f"line {BURSTS * PER_BURST - 1}\n"
    wait_until(lambda: stdout_path.read_text().endswith(last), "the last line in the log")
    assert stdout_path.stat().st_size <= CAP
    home.start()
    assert home.wait_state(job_id, "succeeded")["exit_code"] == 0
    text = log()
    mark, rest = text.split("\n", 1)
    dropped = len(lines(0, BURSTS * PER_BURST - 1)) - len(rest)
    assert mark == f"[gpusched: {dropped} earlier bytes dropped: max_log_size 4K]"
    assert rest.endswith(last)
