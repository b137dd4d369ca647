"""The formats between a job's shim and the daemon: the run file, the wake datagram, /proc/PID/stat.

The shim writes them and the daemon (and `top`, for /proc) reads them; both sides import
this module, so a format is written down once. Standard library only, and nothing costly
to import (no dataclasses, typing or pathlib): the shim loads it, and the shim starts
every job.
"""

from __future__ import annotations

import functools
import json
import os
from collections import namedtuple

TYPE_CHECKING = False  # not `typing`: the shim imports this module, and typing costs time
if TYPE_CHECKING:
    from typing import Any

    from gpusched.core.models import Job

# -- a job's files ----------------------------------------------------------------------------
# They lie in the jobs directory, named by the job's id: ID.run.jsonl, ID.stdout.log,
# ID.stderr.log and ID.progress.json, in a subdirectory per range of IDS_PER_DIR ids
# (jobs/0000/ holds jobs 0-999, jobs/0001/ jobs 1000-1999, ...), so that no directory grows
# past a few thousand names however many jobs a home has seen. No directory per job: on
# some filesystems each one costs the daemon most of a millisecond to make, for every job;
# one per thousand jobs costs nothing. Homes made before the subdirectories keep their
# jobs' files flat in the jobs directory: run_file_found and job_files find those too.

IDS_PER_DIR = 1000


def job_dir(jobs_root: str | os.PathLike[str], job_id: int) -> str:
    """The one place a job's files go: its id range's subdirectory of jobs_root. Every
    path of a job's files is made from this; the shim makes the directory when missing."""
    return _range_dir(os.fspath(jobs_root), job_id // IDS_PER_DIR)


@functools.lru_cache(maxsize=16)  # asked for each of 100,000 jobs a daemon loads
def _range_dir(jobs_root: str, number: int) -> str:
    return os.path.join(jobs_root, f"{number:04d}")


def is_range_dir(name: str) -> bool:
    """Whether a name in a jobs directory is one of job_dir's subdirectories."""
    return len(name) >= 4 and name.isdigit()


def job_files(jobs_root: str | os.PathLike[str]) -> dict[int, list[str]]:
    """The files of jobs under jobs_root (ID.run.jsonl, ID.stdout.log, ...) as paths, by
    id: in the id-range subdirectories, and flat in jobs_root (homes of older versions)."""
    found: dict[int, list[str]] = {}
    _add_job_files(str(jobs_root), found, subdirs=True)
    return found


def _add_job_files(folder: str, found: dict[int, list[str]], subdirs: bool) -> None:
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        head = name.split(".", 1)[0]
        if head.isdigit() and "." in name:
            found.setdefault(int(head), []).append(os.path.join(folder, name))
        elif subdirs and is_range_dir(name):
            _add_job_files(os.path.join(folder, name), found, subdirs=False)


RUN_FILE = "run.jsonl"
"""A run's record (ID.run.jsonl), one JSON object per line, each tagged by its "record"
key, all written by the run's shim:

- "spec" (SPEC): what to run, as the daemon sent it (run_spec);
- "shim" (SHIM): the shim's pid and start time (start_ticks), where a daemon (or its
  successor) finds it;
- "exit" (EXIT): how the job ended (ExitRecord), the shim's last act.

Every record carries the run's token (run_token, under "run"): the daemon reads only
records of the run it started, so a file left by another run of that id (one that
crashed, or an id given again after a lost queue) is never taken for this one's.

The shim, not the daemon, creates the file: on some filesystems creating a file costs
most of a millisecond of CPU, and the daemon starts every job in turn while shims run side
by side. A reader trusts only whole lines: each is written in one write() and ends in a
newline. A runner that cannot create the file says so in its wake-up datagram instead
(launch_failure, sent by runreport.start_failed).
"""
SPEC, SHIM, EXIT = "spec", "shim", "exit"
MAX_ERROR_CHARS = 2000  # keeps the exit record a short line


def run_file(jobs_root: str | os.PathLike[str], job_id: int) -> str:
    """Where a new run's file goes (in the job's id-range subdirectory)."""
    return os.path.join(job_dir(jobs_root, job_id), f"{job_id}.{RUN_FILE}")


def run_file_found(jobs_root: str | os.PathLike[str], job_id: int) -> str:
    """Where a run's file is: run_file, or flat in jobs_root for a run a version before
    the subdirectories started (re-adopted after an upgrade); run_file if neither is."""
    path = run_file(jobs_root, job_id)
    if os.path.lexists(path):
        return path
    flat = os.path.join(jobs_root, f"{job_id}.{RUN_FILE}")
    return flat if os.path.lexists(flat) else path


def log_paths(
    jobs_root: str | os.PathLike[str], job_id: int, flat: bool = False
) -> tuple[str, str]:
    """A job's stdout and stderr logs: in its id-range subdirectory of jobs_root, or
    (flat) in log_root itself: system mode keeps them flat per user, in a directory the
    user owns, where only the user makes anything."""
    stem = os.path.join(jobs_root if flat else job_dir(jobs_root, job_id), str(job_id))
    return stem + ".stdout.log", stem + ".stderr.log"  # one join: a big submit makes 100,000


def own_log_paths(jobs_root: str, log_root: str | None, user: str, job_id: int) -> tuple[str, str]:
    """gpusched's own logs of a job: beside its run file; in system mode (log_root) in the
    user's own log directory, so that the user's client reads them directly and root
    never writes them. A job's --output and --error files are the user's, not these."""
    if log_root is None:
        return log_paths(jobs_root, job_id)
    return log_paths(os.path.join(log_root, user), job_id, flat=True)


def pty_socket_path(own_stdout_log: str, job_id: int) -> str:
    """Where a --pty job's shim listens for `gpusched attach` (proc/ptyhost.py): beside the
    job's own logs, in a directory its user can reach in both modes."""
    return os.path.join(os.path.dirname(own_stdout_log), f"{job_id}.pty.sock")


def progress_path(stdout_path: str, job_id: int) -> str:
    """Where gpusched.job.progress() writes: beside the job's logs, which the job's user
    can write in both modes (the jobs directory, or the user's log directory as root)."""
    return os.path.join(os.path.dirname(stdout_path), f"{job_id}.progress.json")


# Job (gpusched.core.models) is named in this annotation only, never imported: that would
# load the core into every shim. Annotations are not evaluated (see the __future__ import).
def run_token(job: Job) -> str:
    """Names one run of one job: its id, attempt and start time."""
    return f"{job.id}.{job.attempt}.{job.started_at!r}"


def run_spec(
    job: Job,
    env: dict[str, str],
    jobs_root: str,
    wake_path: str,
    grace_s: float,
    cgroup: os.PathLike[str] | None = None,
    run_as: int | None = None,
    max_log_bytes: int = 0,
    own_logs: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The spec a job's shim is launched with, its run file's first record. The shim
    makes every file of the run (see begin_run_file). run_as (system mode): the shim
    drops to this uid before the job touches any path. max_log_bytes: each log's cap
    (0: none; proc/logcap.py). own_logs: gpusched's own log paths of the job; its logs
    that are not (--output, --error) are the user's files, "user_logs"."""
    return {
        "job_id": job.id,
        "run": run_token(job),
        "run_file": run_file(jobs_root, job.id),
        "command": list(job.command),
        "env": dict(env),
        "cwd": job.cwd,
        "stdout": job.stdout_path,
        "stderr": job.stderr_path,
        "grace_s": grace_s,
        "wake": str(wake_path),
        "cpu_ids": list(job.cpu_ids),
        "cgroup": str(cgroup) if cgroup else "",
        "run_as": run_as,
        **({"max_log_bytes": max_log_bytes} if max_log_bytes else {}),
        **({"pty_socket": pty_socket_path(own_logs[0], job.id)} if job.pty and own_logs else {}),
        **user_logs_fields(job, own_logs),
    }


def user_logs_fields(job: Job, own_logs: tuple[str, ...]) -> dict[str, Any]:
    """The run spec's "user_logs" (the job's --output/--error files) and "truncate"
    (--open-mode truncate, at the job's first run only: a retried, requeued or preempted
    job's later runs append, keeping what the earlier ones wrote)."""
    users = (
        [p for p in dict.fromkeys((job.stdout_path, job.stderr_path)) if p and p not in own_logs]
        if job.open_mode
        else []
    )
    if not users:
        return {}
    first_run = job.attempt == 1 and job.restarts == 0
    return {"user_logs": users, "truncate": job.open_mode == "truncate" and first_run}


# -- the shim writes --------------------------------------------------------------------------


def record_line(kind: str, data: dict[str, Any]) -> str:
    return json.dumps({"record": kind, **data}) + "\n"


def append_record(path: str, kind: str, data: dict[str, Any]) -> None:
    """Add one record line to a run file that exists (in one write, so readers see it whole)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    try:
        os.write(fd, record_line(kind, data).encode())
    finally:
        os.close(fd)


def begin_run_file(
    spec: dict[str, Any], spec_line: bytes | None = None, supervised: tuple[int, int] | None = None
) -> str:
    """Create the run file with the spec and this shim's own record; its path.

    spec_line: the spec as the launcher received it (one JSON object), written as it is
    rather than encoded again. supervised: (pid, start ticks) of a job the supervisor
    (proc/supervisor/main.py) started without a shim, recorded in the shim's place: the job
    leads its own session, and the daemon signals and watches it as a shim.
    """
    path: str = spec["run_file"]
    spec_record = (
        b'{"record": "spec", ' + spec_line.strip()[1:] + b"\n"
        if spec_line
        else record_line(SPEC, spec).encode()
    )
    if supervised is None:
        owner = {"pid": os.getpid(), "start_ticks": read_proc_stat().start_ticks}
    else:
        owner = {"pid": supervised[0], "start_ticks": supervised[1], "supervised": True}
    lines = spec_record + record_line(SHIM, {**owner, "run": spec.get("run")}).encode()
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:  # the first job of its id range: make the range's directory
        os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
        fd = os.open(path, flags, 0o600)
    try:
        os.write(fd, lines)
    finally:
        os.close(fd)
    return path


def read_spec(path: str) -> dict[str, Any]:
    """The spec at the head of a run file (to run a job's shim again by hand)."""
    with open(path, "rb") as run:
        first: dict[str, Any] = json.loads(run.readline())
    if first.pop("record", None) != SPEC:
        raise ValueError(f"{path}: the first record is not the job's spec")
    return first


# A named tuple, not a dataclass: dataclasses would cost the shim's launcher an import of
# inspect and more. exit_code is None when a signal ended the job; error is why it could
# not start ("" when it did).
ExitRecord = namedtuple("ExitRecord", "exit_code signal ended_at error", defaults=("",))


def append_exit(path: str, record: ExitRecord, run: str | None = None) -> None:
    """The shim's last record: how the job ended (run: the spec's run token)."""
    append_record(
        path, EXIT, {**record._asdict(), "error": record.error[:MAX_ERROR_CHARS], "run": run}
    )


# -- the daemon reads -------------------------------------------------------------------------

_TAIL_BYTES = 8192  # holds the short "shim" and "exit" records, whatever the spec's size

RunState = namedtuple("RunState", "shim exit")
RunState.__doc__ = """What a run file says so far: shim, the shim's own record (ShimRecord);
exit, an ExitRecord once the job has ended. Either is None until written."""

ShimRecord = namedtuple("ShimRecord", "pid start_ticks supervised", defaults=(False,))
ShimRecord.__doc__ = """The "shim" record: the process the daemon watches for the run, by pid
and start ticks; supervised when that process is the job itself, started by the supervisor
(proc/supervisor/main.py) in a session of its own, rather than a shim."""


def read_run(jobs_root: str | os.PathLike[str], job_id: int, run: str | None = None) -> RunState:
    """The run file's "shim" and "exit" records; with `run` (run_token), only those of
    that run (a record without a token, from a shim older than tokens, counts too). Only
    its tail is read: this runs for every running job on every pass, and the spec before
    them may be long."""
    try:
        records = _tail_records(run_file_found(jobs_root, job_id))
    except OSError:
        return RunState(None, None)
    shim_record = exit_record = None
    for data in records:
        if run is not None and data.get("run") not in (None, run):
            continue  # another run's, left in the file
        try:
            if data.get("record") == SHIM and shim_record is None:
                shim_record = ShimRecord(
                    int(data["pid"]), int(data["start_ticks"]), bool(data.get("supervised"))
                )
            elif data.get("record") == EXIT:
                exit_record = ExitRecord(
                    data.get("exit_code"),
                    data.get("signal"),
                    float(data.get("ended_at", 0)),
                    data.get("error", ""),
                )
        except (KeyError, TypeError, ValueError):
            continue  # not written by a shim of ours: as if absent
    return RunState(shim_record, exit_record)


def _tail_records(path: str) -> list[dict[str, Any]]:
    """The whole lines of the file's tail, parsed; a partial line is left out."""
    fd = os.open(path, os.O_RDONLY)  # not open(): its buffer costs more syscalls
    try:
        size = os.fstat(fd).st_size
        # A record appended since the fstat is not read: as if not written yet.
        data = os.pread(fd, _TAIL_BYTES, max(0, size - _TAIL_BYTES))
    finally:
        os.close(fd)
    records = []
    for line in data.split(b"\n")[:-1]:  # what follows the last newline is not written yet
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the tail's cut-off first line
        if isinstance(record, dict):
            records.append(record)
    return records


def clear_run(jobs_root: str | os.PathLike[str], job_id: int) -> None:
    """Forget a finished run's record before the job is queued again."""
    try:
        os.unlink(run_file_found(jobs_root, job_id))
    except FileNotFoundError:
        pass


# -- the wake datagram ------------------------------------------------------------------------
# A shim sends one to the daemon's wake socket when its job ends, so that the daemon runs a
# pass now rather than at its next timeout. It carries nothing the daemon trusts: the
# daemon reads the exit record itself.

WAKE = b"!"  # the plain wake-up
WAKE_MAX_BYTES = 1024  # the longest datagram: a launch failure's reason fits
_LAUNCH_FAILED = b"launch-failed "


def launch_failure(job_id: int, reason: str) -> bytes:
    """The wake-up of a shim that could not create its run file, so has no other way to
    tell: the daemon fails the job unless a run file shows a shim did start it."""
    return _LAUNCH_FAILED + f"{job_id} {reason}".encode(errors="replace")


# A shim sends its job's end wake-up from a socket named for its run (in Linux's abstract
# namespace: no file to make), and waits a moment for STORED, sent from the daemon's wake
# socket once the end is committed to its queue: then the run file need not be flushed
# to disk as well (two fsyncs a job, which would hold up every other job's files).
STORED = b"stored"
_END_ADDRESS = b"\0gpusched-end "


def end_address(pid: int, run: str) -> bytes:
    """The address a shim reports its job's end from: its pid (unique) and the run's token."""
    return _END_ADDRESS + f"{pid} {run}".encode()


def ended_run(address: object) -> str | None:
    """The run token of a shim's end address; None for any other sender."""
    if not isinstance(address, bytes) or not address.startswith(_END_ADDRESS):
        return None
    _, _, run = address[len(_END_ADDRESS) :].decode(errors="replace").partition(" ")
    return run or None


def parse_launch_failure(message: bytes) -> tuple[int, str] | None:
    """(job id, reason) of a launch_failure datagram; None for a plain wake-up."""
    if not message.startswith(_LAUNCH_FAILED):
        return None
    job_id, _, reason = message[len(_LAUNCH_FAILED) :].decode(errors="replace").partition(" ")
    return (int(job_id), reason) if job_id.isdigit() else None


# -- /proc/PID/stat ---------------------------------------------------------------------------

# The fields of proc(5)'s /proc/PID/stat that gpusched reads, in clock ticks and pages.
ProcStat = namedtuple(
    "ProcStat", "ppid utime_ticks stime_ticks start_ticks rss_pages state session"
)
ProcStat.start_ticks.__doc__ = """When the process started, in clock ticks since boot: with
its pid, it names one process for good, and no clock step can change it."""
ProcStat.state.__doc__ = """One letter: R, S, D, ..., Z for a zombie (ended, not reaped yet)."""
ProcStat.session.__doc__ = """The id of the process's session: its leader's pid."""


def read_proc_stat(pid: int | str = "self") -> ProcStat:
    """One read of /proc/PID/stat; OSError when the process is gone, ValueError (or
    IndexError) for what is not a stat line."""
    fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)  # not open(): its buffer costs more syscalls
    try:
        data = os.read(fd, 4096)  # one line, well under a page
    finally:
        os.close(fd)
    # Fields from the 3rd (state) on: the name before them, in (...), may hold spaces
    # and parentheses, so the split starts after the last ")".
    fields = data[data.rindex(b")") + 2 :].split()
    return ProcStat(
        ppid=int(fields[1]),
        utime_ticks=int(fields[11]),
        stime_ticks=int(fields[12]),
        start_ticks=int(fields[19]),
        rss_pages=int(fields[21]),
        state=fields[0].decode(),
        session=int(fields[3]),
    )
