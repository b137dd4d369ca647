"""What the Slurm hand-off must survive, against a real one-node Slurm: cancel, time limits
with a warning signal, throttled arrays, dependencies, retries, a daemon killed just after
sbatch, a controller that is down, and the number of Slurm calls it costs."""

from __future__ import annotations

import json
import time

from conftest import executable, wait_until
from slurmhome import calls, cluster_home, show


def _submit(home, root, *args: str) -> int:
    out = home.run("submit", "--json", "--cluster", "hpc", *args, cwd=root)
    result = json.loads(out.stdout)
    return result.get("array_id") or result["id"]


def _slurm_state(node, key: str) -> str:
    row = node.run("squeue", "-h", "-r", "-t", "all", "-j", key, "-O", "State", check=False)
    return row.stdout.strip()


def test_cancel_is_confirmed_by_slurm(slurm, make_home, tmp_path):
    home, root = cluster_home(make_home, slurm, tmp_path)
    job_id = _submit(home, root, "--", "sleep", "300")
    wait_until(lambda: show(home, job_id)["state"] == "running", "the job to run on Slurm")
    key = show(home, job_id)["cluster"]["slurm_job_id"]
    home.run("cancel", str(job_id))
    ended = home.wait_state(job_id, "cancelled")
    assert ended["end_reason"].startswith("cancelled by")
    assert _slurm_state(slurm, key) == "CANCELLED"
    # Queued here but not handed over yet (held): cancelled at once, nothing sent to Slurm.
    held = _submit(home, root, "--hold", "--", "true")
    home.run("cancel", str(held))
    assert (
        show(home, held)["state"] == "cancelled"
        and show(home, held)["cluster"]["slurm_job_id"] == ""
    )


def test_time_limit_ends_timeout_after_the_warning_reached_the_command(slurm, make_home, tmp_path):
    home, root = cluster_home(make_home, slurm, tmp_path)
    job_id = _submit(
        home,
        root,
        "--time",
        "1",
        "--signal",
        # Slurm sends the warning at its first periodic check (every 30 s) after
        # end - lead - 30 s: with a lead of 10 s, between 20 and 50 s into the minute, when the
        # batch step surely runs. A longer lead can send it before it exists, and it is lost.
        "USR1@10",
        "--",
        "bash",
        "-c",
        'trap "touch warned" USR1; while :; do sleep 0.2; done',
    )
    ended = home.wait_state(job_id, "timeout", "failed", "succeeded", timeout=150)
    assert ended["state"] == "timeout", ended
    assert (root / "warned").exists()


def test_an_array_throttled_to_two_never_runs_three_and_keeps_each_end(slurm, make_home, tmp_path):
    home, root = cluster_home(make_home, slurm, tmp_path)
    first = _submit(
        home,
        root,
        "--array",
        "0-5%2",
        "--",
        "bash",
        "-c",
        'echo "start $(date +%s.%N)" > "t$GPUSCHED_ARRAY_INDEX"; sleep 1; '
        'echo "end $(date +%s.%N)" >> "t$GPUSCHED_ARRAY_INDEX"; '
        '[ "$GPUSCHED_ARRAY_INDEX" != 3 ]',
    )
    home.run("wait", str(first), check=False, timeout=120)
    states = [show(home, first + i)["state"] for i in range(6)]
    assert states == ["succeeded"] * 3 + ["failed"] + ["succeeded"] * 2
    spans = []
    for i in range(6):
        lines = (root / f"t{i}").read_text().split()
        spans.append((float(lines[1]), float(lines[3])))
    most = max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)
    assert most <= 2, spans
    assert home.run("logs", f"{first}_4").returncode == 0


def test_a_failed_parent_cancels_its_afterok_dependent(slurm, make_home, tmp_path):
    home, root = cluster_home(make_home, slurm, tmp_path)
    parent = _submit(home, root, "--", "bash", "-c", "sleep 2; exit 1")
    child = _submit(home, root, "--dependency", f"afterok:{parent}", "--", "true")
    assert home.wait_state(child, "cancelled", "succeeded", "failed")["state"] == "cancelled"
    assert show(home, parent)["state"] == "failed"


def test_a_retry_is_a_second_slurm_job_under_the_same_id(slurm, make_home, tmp_path):
    home, root = cluster_home(make_home, slurm, tmp_path)
    job_id = _submit(
        home,
        root,
        "--retries",
        "1",
        "--retry-delay",
        "0",
        "--",
        "bash",
        "-c",
        '[ "$GPUSCHED_ATTEMPT" = 2 ]',
    )
    ended = home.wait_state(job_id, "succeeded", "failed")
    assert ended["state"] == "succeeded" and ended["attempt"] == 2
    slurm_ids = ended["cluster"]["slurm_job_ids"]
    assert len(slurm_ids) == 2 and len(set(slurm_ids)) == 2


def test_a_daemon_killed_just_after_sbatch_never_submits_twice(slurm, make_home, tmp_path):
    flag = tmp_path / "killed-once"
    # The logged sbatch kills the daemon (its parent) once the real sbatch has submitted:
    # the job is in Slurm, and the daemon never read its id.
    home, root = cluster_home(
        make_home,
        slurm,
        tmp_path,
        sbatch_extra=(f"if [ ! -e {flag} ]; then touch {flag}; kill -9 $PPID; fi"),
    )
    job_id = _submit(home, root, "--", "true")
    wait_until(lambda: flag.exists() and home.daemon_pid() is None, "the daemon to be killed")
    home.start()
    assert home.wait_state(job_id, "succeeded", "failed")["state"] == "succeeded"
    uuid = next((tmp_path / "shared").iterdir()).name
    comments = slurm.run("squeue", "-h", "-t", "all", "-O", "Comment:|").stdout.split()
    assert comments.count(f"gpusched:{uuid}:{job_id}:1|") == 1
    assert [c[0] for c in calls(tmp_path)].count("sbatch") == 1


def test_jobs_are_stale_not_failed_while_slurmctld_is_down(slurm, make_home, tmp_path):
    home, root = cluster_home(make_home, slurm, tmp_path, lost_grace="2s")
    job_id = _submit(home, root, "--", "sleep", "4")
    wait_until(lambda: show(home, job_id)["state"] == "running", "the job to run")
    slurm.stop_controller()
    try:
        stale = wait_until(
            lambda: (j := show(home, job_id))["cluster"]["stale"] and j, "the job to show as stale"
        )
        assert stale["state"] == "running"
        assert "STALE" in home.run("ls").stdout
        assert f"hpc {stale['cluster']['slurm_job_id']}" in home.run("top", "--once").stdout
        # Local jobs go on meanwhile: Slurm's commands wait on a thread of their own.
        local = home.run("submit", "--cluster", "local", "--wait", "--", "true", cwd=root)
        assert local.returncode == 0
        assert show(home, job_id)["state"] == "running"
    finally:
        slurm.start_controller()
    assert home.wait_state(job_id, "succeeded", "failed", "lost")["state"] == "succeeded"
    assert show(home, job_id)["cluster"]["stale"] == ""


def test_polling_stays_within_its_budget_of_slurm_calls(slurm, make_home, tmp_path):
    home, root = cluster_home(make_home, slurm, tmp_path)
    started = time.monotonic()
    first = _submit(home, root, "--cpus", "0", "--array", "0-119", "--", "true")
    singles = [_submit(home, root, "--cpus", "0", "--", "true") for _ in range(3)]
    home.run("wait", str(first), *map(str, singles), timeout=240)
    wall_s = time.monotonic() - started
    logged = calls(tmp_path)
    squeues = [c for c in logged if c[0] == "squeue"]
    ids_per_call = [len(c[c.index("-j") + 1].split(",")) for c in squeues]
    assert max(ids_per_call) <= 100 and max(ids_per_call) > 1  # batched, never one by one
    assert len(squeues) <= 2 * (wall_s / 0.3) + 4
    assert [c[0] for c in logged].count("sbatch") == 4  # the whole array in one sbatch
    assert not [c for c in logged if c[0] == "sacct"]  # the exit records sufficed
    before = len(calls(tmp_path))
    for _ in range(3):
        home.run("ls", "--all")
        home.run("show", str(first))
        home.run("top", "--once")
    assert len(calls(tmp_path)) == before  # clients never make Slurm calls


def test_a_job_slurm_forgot_without_an_exit_record_is_lost_never_succeeded(
    slurm, make_home, tmp_path
):
    home, root = cluster_home(make_home, slurm, tmp_path, lost_grace="3s")
    # As if slurmctld had purged the job (MinJobAge) and there were no accounting at all.
    executable(tmp_path / "slurmbin" / "squeue", "#!/bin/sh\nexit 0\n")
    executable(
        tmp_path / "slurmbin" / "sacct",
        "#!/bin/sh\necho 'Slurm accounting storage is disabled' >&2\nexit 1\n",
    )
    # The command kills the wrapper (its parent): no exit record is ever written.
    job_id = _submit(home, root, "--", "bash", "-c", "kill -9 $PPID")
    ended = home.wait_state(job_id, "lost", "succeeded", "failed")
    assert ended["state"] == "lost" and "vanished with no exit record" in ended["end_reason"]
