"""For job authors: what gpusched gave this job, progress reports, preemption, memory caps.

Standard library only at import time (torch is imported inside limit_torch_memory), so
`import gpusched.job` costs a job nothing.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from gpusched.core.sched import gpuoom
from gpusched.proc import jobenv

PROGRESS_FILE_VAR = jobenv.PROGRESS_FILE
PROGRESS_MAX_BYTES = 4096  # the reader refuses anything larger: a progress file is tiny
MESSAGE_MAX_CHARS = 200
PROGRESS_MIN_INTERVAL_S = 1.0


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def _signal_or_none(value: str | None) -> int | None:
    """ "SIGUSR1", "USR1" or "10" -> 10; None for anything else."""
    if not value:
        return None
    if value.isdigit():
        return int(value)
    name = value.upper() if value.upper().startswith("SIG") else f"SIG{value.upper()}"
    return int(signal.Signals[name]) if name in signal.Signals.__members__ else None


def _float_or_none(value: str | None) -> float | None:
    try:
        number = float(value) if value not in (None, "") else None
    except ValueError:
        return None
    return number if number is not None and math.isfinite(number) else None


@dataclass(frozen=True)
class JobInfo:
    """The job's side of the GPUSCHED_* environment; None where gpusched did not say."""

    job_id: int | None
    array_index: int | None
    attempt: int | None
    num_gpus: int
    gpu_ids: tuple[str, ...]  # CUDA_VISIBLE_DEVICES entries: UUIDs or indices
    gpu_mem_bytes: int | None  # per GPU; None: whole GPUs
    time_limit_end: float | None  # epoch seconds
    warn_signal: int | None  # sent before the time limit (submit --signal)
    master_addr: str | None
    master_port: int | None

    @property
    def is_under_gpusched(self) -> bool:
        return self.job_id is not None

    def time_left_s(self, now: float | None = None) -> float | None:
        """Seconds until the time limit (never negative), or None without a limit."""
        if self.time_limit_end is None:
            return None
        return max(0.0, self.time_limit_end - (time.time() if now is None else now))


def info(environ: Mapping[str, str] | None = None) -> JobInfo:
    """What this job was given; outside gpusched every field is None or empty."""
    env = os.environ if environ is None else environ
    visible = env.get(jobenv.CUDA_VISIBLE_DEVICES, "")
    gpu_ids = tuple(g for g in visible.split(",") if g)
    return JobInfo(
        job_id=_int_or_none(env.get(jobenv.JOB_ID)),
        array_index=_int_or_none(env.get(jobenv.ARRAY_INDEX)),
        attempt=_int_or_none(env.get(jobenv.ATTEMPT)),
        num_gpus=_int_or_none(env.get(jobenv.NUM_GPUS)) or len(gpu_ids),
        gpu_ids=gpu_ids,
        gpu_mem_bytes=_int_or_none(env.get(jobenv.GPU_MEM)),
        time_limit_end=_float_or_none(env.get(jobenv.TIME_LIMIT_END)),
        warn_signal=_signal_or_none(env.get(jobenv.WARN_SIGNAL)),
        master_addr=env.get(jobenv.MASTER_ADDR) or None,
        master_port=_int_or_none(env.get(jobenv.MASTER_PORT)),
    )


# -- progress -------------------------------------------------------------------------------


class _Progress:
    """Rate-limited writer: most calls only read the clock and return."""

    def __init__(self) -> None:
        # Re-entrant: an on_preempt callback may report progress while the main thread,
        # which the signal interrupted, holds the lock.
        self.lock = threading.RLock()
        self.written_at_s = -math.inf  # monotonic
        self.pending: tuple[float, str] | None = None
        self.atexit_registered = False

    def report(self, fraction: float, message: str, min_interval_s: float) -> bool:
        now_s = time.monotonic()
        with self.lock:
            if fraction < 1.0 and now_s - self.written_at_s < min_interval_s:
                self.pending = (fraction, message)  # written at exit unless a newer one is
                if not self.atexit_registered:
                    self.atexit_registered = True
                    atexit.register(self.flush)
                return False
            self.written_at_s, self.pending = now_s, None
        return self.write(fraction, message)

    @staticmethod
    def write(fraction: float, message: str) -> bool:
        path = os.environ.get(PROGRESS_FILE_VAR)
        # Under torchrun every rank sees the variable; only rank 0 speaks for the job.
        if not path or os.environ.get("RANK", "0") != "0":
            return False
        write_progress_file(path, {"fraction": fraction, "message": message[:MESSAGE_MAX_CHARS]})
        return True

    def flush(self) -> None:
        with self.lock:
            pending, self.pending = self.pending, None
        if pending is not None:
            self.write(*pending)


_progress = _Progress()


def progress(
    fraction: float, message: str = "", *, min_interval_s: float = PROGRESS_MIN_INTERVAL_S
) -> bool:
    """Report how far the job is (0.0 to 1.0) for `ls`, `show` and `top`.

    Cheap enough for every step: at most one small file write per min_interval_s (a
    fraction of 1.0 is always written). Returns whether this call wrote. Outside
    gpusched, and on ranks other than 0, it does nothing.
    """
    fraction = float(fraction)
    if not math.isfinite(fraction):
        raise ValueError(f"progress fraction must be a finite number, not {fraction!r}")
    return _progress.report(min(max(fraction, 0.0), 1.0), str(message), min_interval_s)


def write_progress_file(path: str, record: dict[str, Any]) -> None:
    """Write {fraction, message, updated_at} atomically: readers see all of it or nothing."""
    data = json.dumps({**record, "updated_at": time.time()}).encode()
    tmp = f"{path}.{os.getpid()}.tmp"  # per process: two writers never share a temp file
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        pass  # progress is best effort: a full disk must not kill the training run


def _finite_number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_progress_file(path: str, owner_uid: int | None = None) -> dict[str, Any] | None:
    """The daemon's side: a validated {fraction, message, updated_at}, or None.

    The job owns the file, so it is read defensively: no symlinks, no FIFOs (which would
    block the daemon), no hard links (to a file the job could not read itself), no other
    owner, nothing large, and only well-typed fields come back.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if (
            not stat.S_ISREG(info.st_mode)
            or info.st_nlink != 1
            or (owner_uid is not None and info.st_uid != owner_uid)
        ):
            return None
        raw = os.read(fd, PROGRESS_MAX_BYTES + 1)
        data = json.loads(raw) if len(raw) <= PROGRESS_MAX_BYTES else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if not isinstance(data, dict):
        return None
    fraction, updated_at = data.get("fraction"), data.get("updated_at")
    if not (_finite_number(fraction) and _finite_number(updated_at)):
        return None
    message = data.get("message")
    return {
        "fraction": min(max(float(fraction), 0.0), 1.0),
        "message": message[:MESSAGE_MAX_CHARS] if isinstance(message, str) else "",
        "updated_at": float(updated_at),
    }


# -- preemption -----------------------------------------------------------------------------


class _Preemption:
    """Signal state: which signal came first, and the callback that runs once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.callback: Callable[[int], object] | None = None
        self.exit_on_sigterm = True
        self.in_callback = False
        self.callback_done = False
        self.exit_pending: int | None = None

    def handle(self, signum: int, _frame: object) -> None:
        if self.signum is None:
            self.signum = signum
        if signum == signal.SIGTERM and self.exit_on_sigterm:
            self.exit_pending = 128 + signum
        if self.in_callback:
            return  # a second signal while checkpointing: let the checkpoint finish
        if self.callback is not None and not self.callback_done:
            self.in_callback = True
            try:
                self.callback(signum)
            finally:
                self.in_callback, self.callback_done = False, True
        if self.exit_pending is not None:
            sys.stdout.flush()
            raise SystemExit(self.exit_pending)  # unwinds: finally blocks and atexit run


_preemption = _Preemption()


def on_preempt(
    callback: Callable[[int], object] | None = None,
    *,
    warning_signal: int | None = None,
    exit_on_sigterm: bool = True,
) -> None:
    """Run callback(signum) once, on the warning signal or SIGTERM, so the job can checkpoint.

    gpusched sends SIGTERM on a cancel (SIGKILL follows after the grace period) and a
    warning signal before a time limit: warning_signal if given, else the job's `submit
    --signal` (GPUSCHED_WARN_SIGNAL), else SIGUSR1. After SIGTERM the job exits with status
    143 once the callback has returned, unless exit_on_sigterm is False: then the job must
    poll preempt_requested() and exit by itself within the grace period.

    The callback runs in the main thread between two bytecodes, possibly in the middle of
    a training step; a loop that cannot checkpoint at any point should poll
    preempt_requested() at step boundaries instead. Call it from the main thread.
    """
    _preemption.callback = callback
    _preemption.exit_on_sigterm = exit_on_sigterm
    if warning_signal is None:
        warning_signal = info().warn_signal or signal.SIGUSR1
    for signum in {signal.SIGTERM, warning_signal}:
        signal.signal(signum, _preemption.handle)


def preempt_requested() -> int | None:
    """The first preemption signal received since on_preempt(), or None."""
    return _preemption.signum


# -- memory ---------------------------------------------------------------------------------


def report_oom(detail: str = "", exit_code: int | None = 1) -> None:
    """Tell gpusched this run ran out of GPU memory, then exit with exit_code (None: return).

    For an out-of-memory error gpusched cannot recognise by itself (it knows the messages
    of torch, TensorFlow and JAX): the job ends in state gpu_oom, and with `submit
    --retry-on gpu_oom` is queued again with its --gpu-mem raised (x1.25, --mem-growth).
    It writes a line to the job's stderr, which gpusched reads when the run fails; a run
    that exits 0 after it succeeded all the same. Call it from the main thread.
    """
    sys.stdout.flush()
    line = gpuoom.REPORT_MARK + (b" " + detail.encode(errors="replace") if detail else b"")
    sys.stderr.flush()
    try:
        os.write(sys.stderr.fileno(), line.replace(b"\n", b" ") + b"\n")
    except (OSError, ValueError):  # no stderr: the exit status still says it failed
        pass
    if exit_code is not None:
        raise SystemExit(exit_code)


@dataclass(frozen=True)
class MemoryLimit:
    """What limit_torch_memory did: fraction per visible device, or why nothing."""

    fractions: tuple[float, ...] = ()
    reason: str = ""

    @property
    def is_applied(self) -> bool:
        return bool(self.fractions)


def limit_torch_memory(environ: Mapping[str, str] | None = None) -> MemoryLimit:
    """Cap torch's caching allocator on each visible GPU at the job's --gpu-mem.

    One job sharing a GPU then gets an out-of-memory error instead of taking its
    neighbours' memory. The CUDA context itself (a few hundred MiB) is outside the cap,
    which gpusched's mem_headroom covers. Call it before the first allocation.
    """
    mem_bytes = info(environ).gpu_mem_bytes
    if mem_bytes is None:
        return MemoryLimit(reason="no --gpu-mem declared: the job has whole GPUs")
    try:
        import torch  # noqa: PLC0415 - the job's own torch, seconds to import: only when asked
    except ImportError:
        return MemoryLimit(reason="torch is not installed")
    if not torch.cuda.is_available():
        return MemoryLimit(reason="CUDA is not available: nothing to cap on the CPU")
    fractions = []
    for device in range(torch.cuda.device_count()):
        total_bytes = torch.cuda.get_device_properties(device).total_memory
        fraction = min(1.0, mem_bytes / total_bytes)
        torch.cuda.set_per_process_memory_fraction(fraction, device)
        fractions.append(fraction)
    return MemoryLimit(fractions=tuple(fractions), reason=f"capped at {mem_bytes} bytes per GPU")
