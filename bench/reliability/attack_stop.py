"""Every job can be stopped: jobs that ignore SIGTERM, adopted by a daemon restarted (or
started after a SIGKILL) and then cancelled or timed out, and jobs whose output is a FIFO.
Each must reach a final state within the cancel grace (and some slack for a loaded
machine); one that does not, holding its GPU, is a failure."""

from __future__ import annotations

import os
import time

from reliability.harness import Figures, Home, poll

GRACE_S = 1.0
SLACK_S = 15.0  # a loaded machine's daemon pass, CLI start-ups, the shim's own exit
CONFIG = f'[daemon]\ngpu_poll_interval = "1s"\ncancel_grace = "{GRACE_S:g}s"\n'
SHIMS = '[jobs]\nmax_log_size = "1M"\n'  # a capped log: each job gets a shim of its own
TERM_IGNORER = "trap '' TERM; while :; do sleep 1; done"
FINAL = ("cancelled", "timeout", "failed", "succeeded", "lost")
TIME_LIMIT_S = 8


def measure(small: bool) -> Figures:
    jobs = 2 if small else 4  # one GPU each, of 4: none waits
    fig = Figures(
        f"stops ({jobs} TERM-ignoring jobs per home adopted after a restart and "
        f"after a SIGKILL, cancelled or at --time; FIFO outputs; grace {GRACE_S:g} s)"
    )
    fig.counts.update(
        not_stopped_after_restart=0,
        not_stopped_after_sigkill=0,
        time_limit_overrun=0,
        fifo_not_stopped=0,
        fifo_no_reason=0,
        blocked_after_fifo=0,
    )
    fig.info["slowest_stop_s"] = 0.0
    homes = [("stop", CONFIG)] + ([] if small else [("stop-shims", CONFIG + SHIMS)])
    for tag, config in homes:
        home = Home(tag, simulate="4x80GiB", config=config)
        try:
            home.start()
            for how in ("restart", "sigkill"):
                _adopted_cancel(home, fig, how, jobs)
            _adopted_time_limit(home, fig)
            _fifo_outputs(home, fig)
        finally:
            home.close()
    return fig


def _submit(home: Home, *options: str, command: str = TERM_IGNORER) -> int | None:
    proc = home.cli("submit", "--gpus", "1", *options, "--", "sh", "-c", command)
    return int(proc.stdout) if proc.returncode == 0 else None


def _show(home: Home, job_id: int) -> dict:
    return home.json("show", "--json", str(job_id)) or {}


def _adopt(home: Home, ids: list[int], how: str) -> None:
    """Once each job's pid is stored with it (with its memory peak), restart the daemon,
    or SIGKILL it (the next command starts one)."""
    for job_id in ids:
        poll(lambda job_id=job_id: _show(home, job_id).get("mem_peak_bytes"), 30)
    if how == "restart":
        home.cli("daemon", "restart")
    else:
        home.kill_daemon()


def _ended_within(home: Home, job_id: int, since: float, limit_s: float) -> dict | None:
    """The job once final, if it got there within limit_s of `since` (monotonic)."""
    left = max(0.0, since + limit_s - time.monotonic())
    job = poll(lambda: (j := _show(home, job_id)).get("state") in FINAL and j, left)
    return job or None


def _adopted_cancel(home: Home, fig: Figures, how: str, count: int) -> None:
    ids = [job_id for _ in range(count) if (job_id := _submit(home)) is not None]
    _adopt(home, ids, how)
    cancelled_at = time.monotonic()
    home.cli("cancel", *map(str, ids))  # after a SIGKILL, this starts the daemon
    for job_id in ids:
        job = _ended_within(home, job_id, cancelled_at, GRACE_S + SLACK_S)
        if job is None:
            fig.fail(
                f"not_stopped_after_{how}",
                f"job {job_id} still "
                f"{_show(home, job_id).get('state')} {GRACE_S + SLACK_S:g} s after cancel",
            )
    fig.info["slowest_stop_s"] = max(
        fig.info["slowest_stop_s"], round(time.monotonic() - cancelled_at, 1)
    )


def _adopted_time_limit(home: Home, fig: Figures) -> None:
    job_id = _submit(home, "--time", f"{TIME_LIMIT_S}s")
    if job_id is None:
        fig.fail("time_limit_overrun", "the submit failed")
        return
    submitted_at = time.monotonic()
    _adopt(home, [job_id], "restart")
    job = _ended_within(home, job_id, submitted_at, TIME_LIMIT_S + GRACE_S + SLACK_S)
    if job is None or job["state"] != "timeout":
        fig.fail(
            "time_limit_overrun",
            f"job {job_id} with --time {TIME_LIMIT_S}s: "
            f"{_show(home, job_id).get('state')} after "
            f"{round(time.monotonic() - submitted_at)} s",
        )


def _fifo_outputs(home: Home, fig: Figures) -> None:
    """-o and -e a FIFO nobody reads, with a time limit: refused at the start, or at the
    least stopped in time; and the next job still runs (nothing waits on the FIFO)."""
    fifo = home.path / "pipe"
    os.mkfifo(fifo)
    started_at = time.monotonic()
    for option in ("-o", "-e"):
        job_id = _submit(home, "--time", "5s", option, str(fifo), command="sleep 600")
        job = _ended_within(home, job_id, started_at, 5 + GRACE_S + SLACK_S) if job_id else None
        if job is None:
            fig.fail("fifo_not_stopped", f"{option} FIFO: job {job_id} not stopped")
        elif job["state"] == "failed" and "FIFO" not in (job.get("end_reason") or ""):
            fig.fail("fifo_no_reason", f"{option} FIFO: {job.get('end_reason')!r}")
    after = _submit(home, "-o", os.devnull, command="true")
    if (
        after is None
        or (_ended_within(home, after, time.monotonic(), SLACK_S) or {}).get("state") != "succeeded"
    ):
        fig.fail("blocked_after_fifo", f"a plain job after them (-o /dev/null): job {after}")
