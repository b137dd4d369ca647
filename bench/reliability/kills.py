"""SIGKILL rounds: the daemon killed under awkward running jobs, and one job's shim killed;
every exit status kept, no process left without its job, no GPU given twice.

Plain jobs are watched by the job supervisor, jobs with capped logs each by a shim of its
own (docs/job-semantics.md): each round is run on a home of each kind, and on the second
the victim's shim is the one killed."""

from __future__ import annotations

import json
import os
import signal

from gpusched.proc import runfile
from reliability.harness import Figures, Home, poll
from reliability.jobwatch import ENDED, LeaseWatch, job_processes, orphans

# (name, shell command, state, exit code, signal): what each job must be recorded with.
AWKWARD = (
    ("ignores-term", "trap '' TERM; sleep 2; exit 3", "failed", 3, None),
    ("forks", "sleep 1 & sleep 2 & wait; exit 0", "succeeded", 0, None),
    ("escapes", "setsid sleep 30 & sleep 1; exit 0", "succeeded", 0, None),
    ("chatty", "head -c 20000000 /dev/zero | tr '\\0' x; sleep 1", "succeeded", 0, None),
    ("exits-7", "sleep 1; exit 7", "failed", 7, None),
    ("kills-itself", "sleep 1; kill -KILL $$", "failed", None, 9),
    ("terms-itself", "sleep 2; kill -TERM $$", "failed", None, 15),
    ("quick", "exit 0", "succeeded", 0, None),
)
# Runs until its shim is killed, or until its round ends (cancelled then): a fixed time
# would have it end before a loaded machine found its shim.
SHIM_VICTIM = ("shim-killed", "sleep 900; exit 0")


def _submit(home: Home, name: str, command: str) -> int | None:
    proc = home.cli("submit", "--gpus", "1", "--name", name, "--", "sh", "-c", command)
    return int(proc.stdout) if proc.returncode == 0 and proc.stdout.strip().isdigit() else None


def _shim_pid(home: Home, job_id: int) -> int | None:
    """The pid the job's shim wrote in its run file (a line {"record": "shim", "pid": N})."""
    try:
        with open(runfile.run_file(home.state / "jobs", job_id), encoding="utf-8") as run:
            lines = run.read().splitlines()
    except OSError:
        return None
    for line in lines:
        if '"shim"' in line and line.endswith("}"):
            record = json.loads(line)  # a supervised job's record names the job itself
            return None if record.get("supervised") else record.get("pid")
    return None


def _kill_shim(home: Home, job_id: int) -> bool:
    """SIGKILL the shim of a running job, once its job's processes run."""
    pid = poll(lambda: job_processes(home).get(job_id) and _shim_pid(home, job_id), 60)
    try:
        os.kill(pid, signal.SIGKILL) if pid else None
    except ProcessLookupError:
        return False
    return bool(pid)


def _round(home: Home, fig: Figures, kill_a_shim: bool) -> None:
    expected = {}
    victim = _submit(home, *SHIM_VICTIM)
    for name, command, *want in AWKWARD:
        job_id = _submit(home, name, command)
        if job_id is None:
            fig.fail("exit_status_lost", f"{name}: submit refused")
            continue
        expected[job_id] = (name, *want)
    poll(lambda: len(job_processes(home)) >= 3, 60)
    if kill_a_shim and victim is not None and not _kill_shim(home, victim):
        fig.fail("exit_status_lost", f"could not find job {victim}'s shim to kill")
    home.kill_daemon()
    # Let jobs end while no daemon watches; then the next one must find their records.
    running = set(job_processes(home))
    poll(lambda: not running & set(job_processes(home)) - {victim}, 10)
    home.start()
    done = poll(
        lambda: (
            (jobs := home.jobs()) is not None
            and all(j["state"] in ENDED for j in jobs if j["id"] in expected)
            and jobs
        ),
        90,
    )
    jobs = done or home.jobs() or []
    by_id = {job["id"]: job for job in jobs}
    for job_id, (name, state, code, sig) in expected.items():
        job = by_id.get(job_id, {})
        got = (job.get("state"), job.get("exit_code"), job.get("signal"))
        fig.info["exit_statuses"] = fig.info.get("exit_statuses", 0) + 1
        if got != (state, code, sig):
            fig.fail("exit_status_lost", f"{name}: wanted {(state, code, sig)}, got {got}")
    left = orphans(home, jobs)
    fig.fail("orphans", f"{left}" if left else "", by=sum(map(len, left.values())))
    for pids in left.values():
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if victim is not None:
        home.cli("cancel", str(victim))  # its GPU is free for the next round


# A job with capped logs has a shim of its own (proc/supervisor/starts.py needs_shim).
_SHIMS = '[jobs]\nmax_log_size = "1GiB"\n'


def measure(rounds: int) -> Figures:
    fig = Figures(
        f"SIGKILL rounds ({rounds} on a home of supervised jobs and {rounds} on one "
        f"of jobs with shims, {len(AWKWARD)} awkward jobs each and there a killed "
        "shim, 4 whole GPUs)"
    )
    fig.counts.update(exit_status_lost=0, orphans=0, double_leases=0)
    for tag, config in (("kills", ""), ("kills-shims", _SHIMS)):
        _rounds_on(
            Home(tag, simulate="4x80GiB", config=config), fig, rounds, kill_a_shim=bool(config)
        )
    return fig


def _rounds_on(home: Home, fig: Figures, rounds: int, kill_a_shim: bool) -> None:
    watch = LeaseWatch(home)
    try:
        home.start()
        watch.start()
        for _ in range(rounds):
            _round(home, fig, kill_a_shim)
    finally:
        watch.stop()
        fig.fail(
            "double_leases",
            "; ".join(f"GPU {g[:12]}: jobs {sorted(ids)}" for g, ids in sorted(watch.double)),
            by=len(watch.double),
        )
        home.close()
