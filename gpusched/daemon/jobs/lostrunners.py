"""A job whose shim died without an exit record: stop what it left running, then free its GPUs.

Ending such a job `lost` at once would give its GPUs to the next job while its processes
may run on, on those very GPUs. So its processes are looked for without the shim
(proc/leftovers.py), sent SIGTERM, and SIGKILL once the cancel grace has run out; while any
remain the job stays running in the queue, GPUs and cores reserved, its reason saying
why. A restarted daemon finds the job running with a dead shim and does the same again.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterable
from dataclasses import replace

from gpusched.core.models import LOST_WATCHER_REASONS, SHIM_LOST_REASON, SUPERVISOR_LOST_REASON, Job
from gpusched.daemon.state import Setup
from gpusched.proc import leftovers, runfile
from gpusched.proc.seam import ProcessSeam

log = logging.getLogger("gpusched.jobs")

VANISHED = "the job's shim vanished without an exit record (killed, or the machine rebooted)"
# A job the supervisor started without a shim (proc/supervisor/main.py) whose supervisor died:
# nothing records its end any more.
SUPERVISOR_VANISHED = (
    "the job supervisor that watched the job vanished without an exit "
    "record (killed, or the machine rebooted)"
)
_PIDS_SHOWN = 8  # a reason stays one readable line however many processes a job left


class ShimLoss:
    """What the daemon has done about the processes of jobs whose shim died."""

    def __init__(self, setup: Setup, seam: ProcessSeam):
        self.setup, self.seam = setup, seam
        self.term_sent_at: dict[int, float] = {}  # job id -> when its leftovers got SIGTERM
        self.signalled: dict[int, set[int]] = {}  # job id -> every pid of it signalled
        self.killed: set[int] = set()  # job ids whose leftovers needed SIGKILL

    def is_stopping(self, job_id: int) -> bool:
        """Whether the job's leftovers are being stopped: looked at on every pass."""
        return job_id in self.term_sent_at

    def stop_leftovers(self, job: Job) -> Job | None:
        """Signal the processes the job left; the job as it is to be kept while any remain
        (still running, its reason saying so), or None once none is left."""
        shim = runfile.read_run(self.setup.paths.jobs_dir, job.id).shim
        found = self._leftovers(job, shim)
        if not found:
            return None
        now = self.setup.clock.time()
        sent_at = self.term_sent_at.setdefault(job.id, now)
        seen = self.signalled.setdefault(job.id, set())
        if now >= sent_at + self.setup.settings.cancel_grace_s:
            self.killed.add(job.id)
            self.seam.signal_processes(found, signal.SIGKILL)
        else:
            # New ones too: a child forked since the first SIGTERM gets its own.
            self.seam.signal_processes(
                {p: t for p, t in found.items() if p not in seen}, signal.SIGTERM
            )
        supervised = shim is not None and shim.supervised  # found: its record is there
        if not seen:
            who = "supervisor" if supervised else "shim"
            note = f"job {job.id}'s {who} died; sent SIGTERM to its processes ({_pids(found)})"
            log.warning(note)
            self.seam.append_to_log(job.stderr_path, note, job.uid)
        seen.update(found)
        why = SUPERVISOR_LOST_REASON if supervised else SHIM_LOST_REASON
        return replace(
            job, end_reason=f"{why} ({_pids(found)}); its GPUs stay reserved until they are gone"
        )

    def lost_reason(self, job: Job) -> str:
        """Why the job ended lost, saying what was done to what it left; forgets the job."""
        self.term_sent_at.pop(job.id, None)
        stopped = self.signalled.pop(job.id, set())
        how = "SIGTERM, then SIGKILL after the cancel grace" if job.id in self.killed else "SIGTERM"
        self.killed.discard(job.id)
        vanished = SUPERVISOR_VANISHED if self._supervised(job) else VANISHED
        if stopped:
            return (
                f"{vanished}; gpusched stopped the processes it left "
                f"({_pids(stopped)}; {how}) before freeing its GPUs"
            )
        if job.end_reason.startswith(LOST_WATCHER_REASONS):  # stopped before a restart
            return f"{vanished}; the processes it left have ended"
        return vanished

    def _supervised(self, job: Job) -> bool:
        """Whether the run's "shim" is the job itself, started by the supervisor."""
        shim = runfile.read_run(self.setup.paths.jobs_dir, job.id).shim
        return bool(shim is not None and shim.supervised)

    def next_deadline(self) -> float | None:
        """When the next SIGKILL of leftovers is due (epoch s)."""
        grace_s = self.setup.settings.cancel_grace_s
        return min(
            (
                sent + grace_s
                for job_id, sent in self.term_sent_at.items()
                if job_id not in self.killed
            ),
            default=None,
        )

    def _leftovers(self, job: Job, shim: runfile.ShimRecord | None) -> dict[int, int]:
        """pid -> start ticks of the job's live processes (none when its shim never ran, or
        the machine has rebooted since); shim: its run file's record of the shim."""
        if job.boot_id != self.seam.boot_id:
            return {}
        jobs_dir = self.setup.paths.jobs_dir
        if shim is None:
            return {}  # the shim writes this record before it starts the job
        try:
            spec = runfile.read_spec(runfile.run_file_found(jobs_dir, job.id))
        except (OSError, ValueError):
            spec = {}  # found by its session alone
        return self.seam.job_processes(leftovers.marks_of(spec, shim, job.uid))


def _pids(pids: Iterable[int]) -> str:
    ordered = sorted(pids)
    shown = ", ".join(map(str, ordered[:_PIDS_SHOWN]))
    more = f" and {len(ordered) - _PIDS_SHOWN} more" if len(ordered) > _PIDS_SHOWN else ""
    word = "pid" if len(ordered) == 1 else "pids"
    return f"{word} {shown}{more}"
