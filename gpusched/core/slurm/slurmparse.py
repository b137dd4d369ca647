"""What Slurm 22.05 and later print, read (pure): squeue -O rows, sacct -P rows, the
wrapper's records, and how each ends a gpusched job. Never "missing means succeeded"."""

from __future__ import annotations

import signal as signals
from dataclasses import dataclass
from datetime import datetime

from gpusched.core.models import JobState

# squeue's columns, in order: filters (-j, -t) are honoured by this text form, not by
# --json on 22.05 (tests/fixtures/slurm_22.05). exit_code is the raw wait(2) status.
SQUEUE_FORMAT = (
    "JobID:|,ArrayJobID:|,ArrayTaskID:|,State:|,Reason:|,exit_code:|,"
    "NodeList:|,StartTime:|,EndTime:|,Comment:|,Name:|"
)
SACCT_FIELDS = "JobID,JobName,State,ExitCode,Start,End,NodeList"
# Slurm states that end a job, and the gpusched state each means before the wrapper's
# exit record is read (COMPLETED and FAILED are decided by the record).
_FINAL = {
    "COMPLETED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT,
    "DEADLINE": JobState.TIMEOUT,
    "OUT_OF_MEMORY": JobState.OOM,
    "NODE_FAIL": JobState.LOST,
    "BOOT_FAIL": JobState.LOST,
    "PREEMPTED": JobState.LOST,
    "REVOKED": JobState.CANCELLED,
    "SPECIAL_EXIT": JobState.FAILED,
}
_RUNNING = frozenset(
    {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"}
)


@dataclass(frozen=True)
class SlurmRow:
    """One job (or array task) as Slurm reports it."""

    key: str  # "123", or "123_4" for an array task
    state: str  # COMPLETED, PENDING, ... (the first word: "CANCELLED by 0" is CANCELLED)
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    node: str = ""
    started_at: float | None = None
    ended_at: float | None = None
    comment: str = ""

    @property
    def is_final(self) -> bool:
        return self.state in _FINAL

    @property
    def is_running(self) -> bool:
        return self.state in _RUNNING


def decode_wait_status(status: int) -> tuple[int | None, int | None]:
    """(exit code, signal) of a raw wait(2) status: 768 -> (3, None), 9 -> (None, 9)."""
    if status & 0x7F:
        return None, status & 0x7F
    return (status >> 8) & 0xFF, None


def _time(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        return None  # N/A, Unknown, NONE, (null)


def _text(text: str) -> str:
    text = text.strip()
    return "" if text in ("(null)", "N/A", "None", "(None)") else text


def parse_squeue(text: str) -> dict[str, SlurmRow]:
    """The rows of `squeue -h -r -t all -O SQUEUE_FORMAT`, by key."""
    rows: dict[str, SlurmRow] = {}
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) < 10 or not cells[0].strip():
            continue
        job_id, array_job, task = (c.strip() for c in cells[:3])
        key = f"{array_job}_{task}" if task and task != "N/A" and task.isdigit() else job_id
        raw = cells[5].strip()
        code, sig = decode_wait_status(int(raw)) if raw.isdigit() else (None, None)
        rows[key] = SlurmRow(
            key=key,
            state=cells[3].strip().split(" ")[0],
            reason=_text(cells[4]),
            exit_code=code,
            signal=sig,
            node=_text(cells[6]),
            started_at=_time(cells[7]),
            ended_at=_time(cells[8]),
            comment=_text(cells[9]),
        )
    return rows


def parse_sacct(text: str) -> dict[str, SlurmRow]:
    """The rows of `sacct -P -o SACCT_FIELDS` (or `sacct -c`, from jobcomp without a
    database), by key; job steps (123.batch) left out, the latest record of a key kept."""
    rows: dict[str, SlurmRow] = {}
    lines = text.splitlines()
    if not lines:
        return rows
    header = lines[0].split("|")
    for line in lines[1:]:
        cells = dict(zip(header, line.split("|")))
        key = cells.get("JobID", "").strip()
        if not key or "." in key:
            continue
        code_text, _, sig_text = cells.get("ExitCode", "").partition(":")
        sig = int(sig_text) if sig_text.isdigit() and int(sig_text) else None
        rows[key] = SlurmRow(
            key=key,
            state=cells.get("State", "").split(" ")[0],
            exit_code=int(code_text) if code_text.isdigit() and not sig else None,
            signal=sig,
            node=_text(cells.get("NodeList", "")),
            started_at=_time(cells.get("Start", "")),
            ended_at=_time(cells.get("End", "")),
        )
    return rows


def parse_record(text: str) -> dict[str, str]:
    """A wrapper record: `status=3 error=...` or `host=n1 job_gpus=0,1 ...`; the last
    key (error) takes the rest of the line, spaces and all."""
    record: dict[str, str] = {}
    rest = text.strip()
    while rest:
        key, _, rest = rest.partition("=")
        if key == "error":
            record[key] = rest
            break
        value, _, rest = rest.partition(" ")
        record[key.strip()] = value
    return record


def record_outcome(record: dict[str, str]) -> tuple[int | None, int | None, str]:
    """(exit code, signal, error) of an exit record; a shell status above 128 is a signal."""
    status = int(record["status"]) if record.get("status", "").isdigit() else None
    error = record.get("error", "")
    if status is not None and status > 128 and status - 128 in signals.valid_signals():
        return None, status - 128, error
    return status, None, error


def final_state(row: SlurmRow | None, record: dict[str, str] | None) -> tuple[JobState, str]:
    """How a job that ended went, and why in words: Slurm's own state for the cause
    (cancelled, timeout, node failure), else the wrapper's exit record; without a record
    a job never counts as succeeded."""
    if row is not None and row.state not in ("COMPLETED", "FAILED"):
        state = _FINAL.get(row.state, JobState.FAILED)
        return state, f"Slurm: {row.state}" + (f" ({row.reason})" if row.reason else "")
    if record is None:
        said = f"Slurm says {row.state}" if row is not None else "Slurm no longer knows it"
        return JobState.FAILED, f"no exit record on the shared directory ({said})"
    code, _, error = record_outcome(record)
    return (JobState.SUCCEEDED if code == 0 and not error else JobState.FAILED), error
