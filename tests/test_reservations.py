"""GPU reservations in the daemon: `reserve create/ls/show/delete`, `submit --reservation`,
others' jobs kept off reserved GPUs, the timer at a reservation's start and end, preemption
at its start, and who may reserve (in-process with a moving clock, then through the CLI)."""

from __future__ import annotations

import json
import os

import pytest

import inproc
from conftest import wait_until
from gpusched.client import protocol
from gpusched.core.errors import GpuschedError, NotFound, PermissionDenied, UsageError
from gpusched.core.users import user_name
from gpusched.daemon.loop import Call
from gpusched.daemon.requests.request import Request

ME = user_name(os.getuid())
STRANGER = (os.getpid(), 65534, 65534)  # not the daemon's user, not an admin
HOUR = 3600.0


def ask(box, cmd, creds=inproc.ME, **args):
    """box.call, for requests that take a `name` (box.call's own first argument)."""
    protocol.check_request({"cmd": cmd, "args": args})
    call = Call(Request(cmd, args, creds))
    box.daemon.step([call])
    if call.error is not None:
        raise call.error
    return json.loads(json.dumps(call.result))


def reserve(box, gpus=(2, 3), start_in=HOUR, hours=2.0, creds=inproc.ME, **args):
    now = box.clock.time()
    return ask(
        box,
        "reserve",
        creds,
        gpus=list(gpus),
        start_time=now + start_in,
        end_time=now + start_in + hours * HOUR,
        **args,
    )


def gpus_of(box, job_id):
    return box.show(job_id)["gpu_indices"]


def test_others_stay_off_reserved_gpus_unless_their_time_ends_before_it(box):
    made = reserve(box, name="demo", users=[ME])
    assert (made["name"], made["gpus"], made["users"]) == ("demo", [2, 3], [ME])
    free = [box.submit("--gpus", "1", "--", "true") for _ in range(3)]
    assert sorted(g for j in free[:2] for g in gpus_of(box, j)) == [0, 1]
    reason = box.show(free[2])["pending_reason"]
    assert reason.startswith("GPUs 2,3 are reserved from ")
    assert "(reservation demo; no --time)" in reason
    short = box.submit("--gpus", "1", "--time", "30m", "--", "true")
    assert gpus_of(box, short)[0] in (2, 3)  # it ends before the reservation starts
    long = box.submit("--gpus", "1", "--time", "2h", "--", "true")
    assert "its --time runs past that" in box.show(long)["pending_reason"]


def test_its_jobs_wait_for_the_start_and_others_are_preempted_then(box):
    reserve(box, name="demo", users=[ME], start_in=HOUR)
    victim = box.submit("--gpus", "1", "--time", "50m", "--preemptible", "--", "true")
    assert gpus_of(box, victim)[0] in (2, 3)
    mine = box.submit("--gpus", "2", "--reservation", "demo", "--", "true")
    assert box.show(mine)["pending_reason"].startswith("Reservation demo (starts at")
    start = box.clock.time() + HOUR
    assert box.daemon.control.next_deadline() <= start
    box.step(HOUR - 1)
    assert box.show(mine)["state"] == "pending"
    box.step(1.0)  # the timer's pass at the start: the preemptible job is stopped
    shown = box.show(victim)
    assert shown["preempting"] and "reservation demo" in shown["requeue_reason"]
    box.exit(victim, None, signum=15)
    box.step()
    assert sorted(gpus_of(box, mine)) == [2, 3]
    other = box.submit("--gpus", "1", "--time", "1m", "--", "true")
    assert gpus_of(box, other)[0] in (0, 1)  # never 2 or 3 inside the window


def test_at_the_start_a_preemptible_job_on_its_gpus_is_preempted_with_nothing_waiting(box):
    victim = box.submit("--gpus", "1", "--preemptible", "--", "true")  # before the reservation
    kept = box.submit("--gpus", "1", "--", "true")  # not preemptible
    reserve(box, name="demo", users=[ME], gpus=(0, 1, 2, 3), start_in=HOUR)
    box.step(HOUR - 1)
    assert not box.show(victim)["preempting"]
    box.step(1.0)
    assert box.show(victim)["preempting"] and not box.show(kept)["preempting"]


def test_a_job_preempts_only_where_the_reservations_let_it_run(box):
    reserve(box, name="demo", users=[ME], start_in=HOUR)
    first = [box.submit("--gpus", "1", "--preemptible", "--", "true") for _ in range(2)]
    box.step(600.0)
    later = [
        box.submit("--gpus", "1", "--time", "30m", "--preemptible", "--", "true") for _ in range(2)
    ]
    assert sorted(g for j in later for g in gpus_of(box, j)) == [2, 3]
    box.step(600.0)
    urgent = box.submit("--gpus", "1", "--priority", "10", "--", "true")  # no --time
    stopping = [j for j in first + later if box.show(j)["preempting"]]
    assert len(stopping) == 1 and stopping[0] in first, [box.show(j) for j in first + later]
    assert box.show(urgent)["pending_reason"].startswith("preempting job")


def test_the_end_frees_the_gpus_and_a_restart_keeps_the_reservation(box):
    reserve(box, name="demo", users=[ME], start_in=HOUR, hours=1.0)
    box.restart()
    assert [r["name"] for r in box.call("reservations")["reservations"]] == ["demo"]
    waiting = [box.submit("--gpus", "1", "--", "true") for _ in range(3)]
    assert box.show(waiting[2])["state"] == "pending"
    box.step(2 * HOUR)  # the timer's pass at the end
    assert box.show(waiting[2])["state"] == "running"
    assert box.call("reservations")["reservations"] == []


def test_submit_reservation_is_refused_to_others_and_for_unknown_names(box):
    reserve(box, name="demo", users=[ME])
    with pytest.raises(NotFound, match="no such reservation"):
        box.submit("--reservation", "nope", "--", "true")
    with pytest.raises(UsageError, match="holds 2 GPUs"):
        box.submit("--gpus", "3", "--reservation", "demo", "--", "true")
    with pytest.raises(PermissionDenied, match=f"is for {ME}, not nobody"):
        box.call("submit", STRANGER, jobs=[{"command": ["true"], "reservation": "demo"}], cwd="/")


def test_clashes_names_and_deletes(box):
    reserve(box, name="demo", users=[ME])
    with pytest.raises(GpuschedError, match="are reserved by demo"):
        reserve(box, gpus=(3,), name="other")
    with pytest.raises(GpuschedError, match="exists already"):
        reserve(box, gpus=(0,), name="demo")
    with pytest.raises(UsageError, match="no GPU 7"):
        reserve(box, gpus=(7,))
    assert reserve(box, gpus=(0,))["name"] == f"{ME}_1"
    with pytest.raises(PermissionDenied, match=f"made by {ME}"):
        ask(box, "unreserve", STRANGER, name="demo")
    assert ask(box, "unreserve", name="demo") == {"deleted": "demo"}
    with pytest.raises(NotFound, match="no reservation 'demo'"):
        box.call("reservations", names=["demo"])


def test_only_admins_reserve_unless_a_user_limit_is_set(make_box):
    box = make_box()
    with pytest.raises(PermissionDenied, match="only an admin may reserve"):
        reserve(box, creds=STRANGER, users=["nobody"])
    box = make_box(config="[reservations]\nuser_max_gpu_hours = 5\n")
    assert reserve(box, gpus=(1, 2), hours=2.0, creds=STRANGER)["users"] == ["nobody"]
    with pytest.raises(PermissionDenied, match="for yourself"):
        reserve(box, gpus=(0,), hours=0.5, creds=STRANGER, users=[ME])
    with pytest.raises(PermissionDenied, match="user_max_gpu_hours; holds 4"):
        reserve(box, gpus=(0,), hours=1.5, creds=STRANGER)
    assert reserve(box, gpus=(0,), hours=1.0, creds=STRANGER)["name"] == "nobody_2"


# -- through the CLI and a real daemon -------------------------------------------------------
def test_reserve_commands_through_the_cli(home):
    made = home.run(
        "reserve",
        "create",
        "--gpus",
        "1",
        "--start",
        "now+1hour",
        "--duration",
        "4h",
        "--name",
        "demo",
        "--json",
    )
    assert json.loads(made.stdout)["gpus"] == [1]
    listed = home.run("reserve", "ls").stdout
    assert listed.splitlines()[1].startswith("demo       1       ")
    assert max(len(line) for line in listed.splitlines()) <= 80
    assert json.loads(home.run("reserve", "ls", "--json").stdout)[0]["name"] == "demo"
    assert "duration=4h00m" in home.run("reserve", "show", "demo").stdout
    job_id = home.submit("--reservation", "demo", "--", "true")
    assert "reservation=demo" in home.run("show", str(job_id)).stdout
    wait_until(
        lambda: home.show(job_id)["pending_reason"].startswith("Reservation demo (starts at"),
        "the reservation's reason",
    )
    bad = home.run(
        "reserve", "create", "--gpus", "1", "--duration", "1h", "--start", "soon", check=False
    )
    assert bad.returncode == 2 and bad.stderr.startswith("Error: --start 'soon' is not a time")
    home.run("reserve", "delete", "demo")
    gone = home.run("reserve", "show", "demo", check=False)
    assert gone.returncode == 1 and gone.stderr.startswith("Error: no reservation 'demo'")
    wait_until(
        lambda: "ended or was deleted" in home.show(job_id)["pending_reason"], "the job's reason"
    )


@pytest.mark.e2e
def test_simulate_reservations_through_the_cli(tmp_path):
    from test_simulator import gpusched, history

    trace = history(tmp_path, [("a", "u", 0, 1, 7200), ("b", "v", 0, 1, 7200)])
    calendar = tmp_path / "calendar.toml"
    calendar.write_text('[[reservation]]\nname = "demo"\ngpus = [1]\nduration = "1h"\n')
    plain = json.loads(gpusched("simulate", str(trace), "--gpus", "2", "--json").stdout)
    proc = gpusched(
        "simulate", str(trace), "--gpus", "2", "--reservations", str(calendar), "--json"
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["makespan_s"] == plain["makespan_s"] + 3600  # b waits out the window
    bad = gpusched("simulate", str(trace), "--reservations", str(calendar), "--preemption")
    assert bad.returncode == 2
    assert bad.stderr.startswith("Error: --reservations replay without preemption")


def test_a_preview_and_a_forecast_see_the_reservations(box):
    # Four GPUs, 2 and 3 reserved an hour from now for two hours; 0 and 1 busy with jobs of
    # two hours, which the reservation keeps off 2 and 3. A job without --time may not take
    # 2 or 3 either: a preview says why, and its forecast start is when 0 and 1 free, two
    # hours from now, not at once.
    reserve(box, name="demo", users=[ME])
    busy = [box.submit("--gpus", "1", "--time", "2h", "--", "sleep", "1") for _ in range(2)]
    box.step()
    assert sorted(g for j in busy for g in gpus_of(box, j)) == [0, 1]
    preview = box.call("submit", dry_run=True, jobs=[{"command": ["true"], "gpus": 1}], cwd="/")
    assert not preview["would_start"] and "reservation demo" in preview["reason"]
    waiting = box.submit("--gpus", "2", "--", "true")
    rows = {row["id"]: row for row in box.call("list", start=True, states=["pending"])["jobs"]}
    assert rows[waiting]["start_forecast"] == box.clock.time() + 2 * HOUR
