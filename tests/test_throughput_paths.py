"""The short paths of many short jobs: a job's end told to its shim once it is stored, and
the scheduling pass that explains a long queue of alike jobs.

End to end: a real daemon in a temporary home, jobs through the real CLI, and the wake
socket spoken to as a job's shim speaks to it. The shim's side runs its real code against
a socket playing the daemon.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from conftest import wait_until
from gpusched.client.paths import resolve_paths
from gpusched.core.models import GpuInfo, Inventory, Job, JobState, Request
from gpusched.core.sched import placement, queuerules, scheduling
from gpusched.proc import runfile, runreport

GiB = 1024**3


# -- the daemon answers a shim once the job's end is stored -------------------------------------


def _report_end(wake_path: str, run: str) -> socket.socket:
    """What a shim does when its job ends: a wake-up from the run's end address."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(runfile.end_address(os.getpid(), run))
    sock.sendto(runfile.WAKE, wake_path)
    return sock


def _answer(sock: socket.socket, timeout: float) -> tuple[bytes, object] | None:
    sock.settimeout(timeout)
    try:
        return sock.recvfrom(64)
    except TimeoutError:
        return None


def _run_token(jobs_dir: str, job_id: int) -> str:
    return runfile.read_spec(runfile.run_file(jobs_dir, job_id))["run"]


def test_the_daemon_tells_a_shim_its_jobs_end_is_stored_only_once_it_is(home):
    """A shim may skip flushing its exit record only when the daemon has the end in its
    queue: a running job's report goes unanswered until its end is stored."""
    home.start()
    paths = resolve_paths(home.env)
    done = home.submit("--gpus", "0", "--", "true")
    running = home.submit("--gpus", "0", "--", "sleep", "300")
    home.wait_state(done, "succeeded")
    home.wait_state(running, "running")
    wait_until(
        lambda: os.path.exists(runfile.run_file(paths.jobs_dir, running)),
        "the running job's run file",
    )

    with _report_end(paths.wake_socket, _run_token(paths.jobs_dir, done)) as ended:
        assert _answer(ended, 30) == (runfile.STORED, paths.wake_socket)

    with _report_end(paths.wake_socket, _run_token(paths.jobs_dir, running)) as early:
        # Passes run (another job's end wakes the loop), but this run has not ended.
        other = home.submit("--gpus", "0", "--", "true")
        home.wait_state(other, "succeeded")
        assert _answer(early, 0.5) is None
        home.run("cancel", str(running))
        home.wait_state(running, "cancelled")
        assert _answer(early, 30) == (runfile.STORED, paths.wake_socket)


def test_a_flood_of_forged_reports_is_answered_without_harm(home):
    """Anyone who can reach the wake socket may send reports for runs that do not exist:
    they are told "stored" (nothing of theirs runs here) and the daemon carries on."""
    home.start()
    paths = resolve_paths(home.env)
    for n in range(50):
        with _report_end(paths.wake_socket, f"{n}.1.0.5") as forged:
            assert _answer(forged, 30) == (runfile.STORED, paths.wake_socket)
    job = home.submit("--gpus", "0", "--", "sh", "-c", "exit 3")
    assert home.wait_state(job, "failed")["exit_code"] == 3


# -- the shim flushes its exit record unless the daemon said it stored the end --------------------


def _spec(tmp_path: Path) -> dict:
    run_file = tmp_path / "1.run.jsonl"
    run_file.write_text("")
    return {
        "job_id": 1,
        "run": "1.1.123.5",
        "run_file": str(run_file),
        "wake": str(tmp_path / "wake"),
    }


def _play_daemon(tmp_path: Path, answer: bytes | None, from_path: str = "wake") -> threading.Thread:
    """A wake socket that answers the first report (from the socket at `from_path`)."""
    wake = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    wake.bind(str(tmp_path / "wake"))
    sender = wake
    if from_path != "wake":
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sender.bind(str(tmp_path / from_path))

    def serve() -> None:
        with wake, sender:
            wake.settimeout(30)
            _, address = wake.recvfrom(64)
            if answer is not None:
                sender.sendto(answer, address)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    "answer, from_path, flushed",
    [
        (runfile.STORED, "wake", False),  # the daemon has the end: no flush
        (None, "wake", True),  # no answer (a daemon that cannot write its queue)
        (b"nonsense", "wake", True),
        (runfile.STORED, "impostor", True),  # "stored", but not from the daemon's socket
    ],
    ids=["stored", "no-answer", "other-answer", "impostor"],
)
def test_the_shim_flushes_its_exit_record_unless_the_daemon_stored_the_end(
    tmp_path, monkeypatch, answer, from_path, flushed
):
    spec = _spec(tmp_path)
    daemon = _play_daemon(tmp_path, answer, from_path)
    flushes = []
    monkeypatch.setattr(runreport, "make_durable", flushes.extend)
    monkeypatch.setattr(runreport, "STORED_WAIT_S", 0.5 if flushed else 30.0)
    runreport.record_exit(spec["run_file"], spec, runfile.ExitRecord(0, None, time.time()))
    daemon.join(30)
    assert flushes == ([spec["run_file"]] if flushed else [])
    assert runfile.read_run(tmp_path, 1, spec["run"]).exit.exit_code == 0


def test_with_no_daemon_the_shim_flushes_its_exit_record_at_once(tmp_path, monkeypatch):
    spec = _spec(tmp_path)  # nothing listens on the wake path
    flushes = []
    monkeypatch.setattr(runreport, "make_durable", flushes.extend)
    monkeypatch.setattr(runreport, "STORED_WAIT_S", 3600.0)  # a wait would hang the test
    runreport.record_exit(spec["run_file"], spec, runfile.ExitRecord(0, None, time.time()))
    assert flushes == [spec["run_file"]]


# -- one scheduling pass over a long queue of alike jobs ---------------------------------------


def _gpus(count: int) -> Inventory:
    return Inventory(
        gpus=tuple(
            GpuInfo(
                index=i,
                uuid=f"GPU-{i}",
                name="Simulated GPU",
                mem_total_bytes=80 * GiB,
                mem_used_bytes=0,
                util_pct=0.0,
            )
            for i in range(count)
        ),
        backend="simulated",
    )


def _pending(first_id: int, count: int, request: Request) -> list[Job]:
    return [
        Job(
            id=i,
            command=("true",),
            cwd="/",
            user="u",
            uid=1000,
            request=request,
            state=JobState.PENDING,
            submitted_at=float(i),
        )
        for i in range(first_id, first_id + count)
    ]


def test_alike_jobs_that_cannot_start_are_explained_once_per_pass(monkeypatch):
    """A thousand alike jobs behind a full box: one reason worked out, not one per job,
    and each job still gets the reason the loads give after this pass's starts."""
    inventory = _gpus(4)
    whole = Request(gpus=1)
    pending = _pending(1, 1000, whole) + _pending(2000, 3, Request(gpus=1, gpu_mem_bytes=GiB))
    calls = []
    real = placement.pending_reason
    monkeypatch.setattr(
        placement, "pending_reason", lambda *args: calls.append(args[0]) or real(*args)
    )
    loads = placement.gpu_loads(inventory, [], {})
    plan = scheduling.schedule(
        pending, [], loads, inventory, placement.PlacementRules(), queuerules.QueueRules(), now=1.0
    )

    assert [job_id for job_id, _ in plan.starts] == [1, 2, 3, 4]
    assert len(calls) == 2  # one per kind of request, on the loads after the starts
    after = dict(loads)
    for job_id, gpus in plan.starts:
        placement.take(after, next(j for j in pending if j.id == job_id), gpus)
    for job in pending[4:]:
        behind = "" if job.id == 5 else "behind job 5, which is next in line; "
        assert plan.reasons[job.id] == behind + real(
            job.request, after, inventory, placement.PlacementRules()
        )
    assert plan.reasons[5] == "needs 1 whole GPU; every allowed GPU is held whole by a running job"
