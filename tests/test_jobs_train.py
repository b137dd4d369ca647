"""jobs/train_ddp.py under a real daemon: 2 Gloo ranks via torchrun, checkpoints, resume, preemption."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import REPO, find_shim, wait_until

torch = pytest.importorskip("torch")

TRAIN = REPO / "jobs" / "train_ddp.py"
# torchrun forwards only these to its workers; the rest (SIGUSR1 by default) would kill it
# and orphan the workers, which torchrun puts in sessions of their own.
SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


def torchrun_command(checkpoint_dir: Path, steps: int, *extra: str) -> list[str]:
    """The documented idiom: sh -c, so that $MASTER_PORT is the job's, expanded in the job."""
    launcher = f"{shlex.quote(sys.executable)} -m torch.distributed.run"  # = torchrun
    script = (
        f'exec {launcher} --nproc-per-node=2 --master-port="$MASTER_PORT" '
        f"--signals-to-handle={SIGNALS} {shlex.quote(str(TRAIN))} "
        f"--checkpoint-dir {shlex.quote(str(checkpoint_dir))} --steps {steps} "
        + " ".join(map(shlex.quote, extra))
    )
    return ["--gpus", "2", "--", "sh", "-c", script]


def saved_step(checkpoint_dir: Path) -> int:
    state = torch.load(checkpoint_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    return int(state["step"])


def logs(home, job_id: int) -> str:
    return home.run("logs", str(job_id)).stdout


def test_trains_with_two_gloo_ranks_checkpoints_and_resumes(home, tmp_path):
    """Then each preemption below in turn, each run resuming from the one before.

    One chain rather than separate tests: every torchrun start costs seconds of torch
    imports on a small CI machine.
    """
    # Away from torchrun's default 29500, so that only the idiom can make the ports match.
    home.write_config("[jobs]\nmaster_port_min = 29731\nmaster_port_max = 29799\n")
    ckpt = tmp_path / "ckpt"
    first = home.submit(
        *torchrun_command(ckpt, 20, "--checkpoint-every", "10", "--log-every", "10")
    )
    job = home.wait_state(first, "succeeded", "failed", timeout=180)
    log = logs(home, first)
    assert job["state"] == "succeeded", log + home.run("logs", "--stderr", str(first)).stdout
    # The port the ranks met on is the one gpusched gave the job, not torchrun's 29500.
    assert 29731 <= job["master_port"] <= 29799
    assert f"backend=gloo world_size=2 master_port={job['master_port']}" in log
    assert "starting from step 0" in log and "checkpoint saved at step 20" in log
    assert re.search(r"step 20 loss [\d.]+ \d+ samples/s", log)
    step = saved_step(ckpt)
    assert step == 20
    for how, (submit_args, preempt, signum) in PREEMPTIONS.items():
        step = run_until_preempted(home, ckpt, step, how, submit_args, preempt, signum)
    check_nightly_eval_passes_the_status_on(home, ckpt, step)


def run_until_preempted(
    home, ckpt: Path, last_step: int, how: str, submit_args: tuple, preempt, signum: int
) -> int:
    """Resume from last_step, train until told to stop; returns the step checkpointed."""
    # Steps without end and no periodic checkpoint: only the preemption can write one.
    job_id = home.submit(
        *submit_args,
        *torchrun_command(ckpt, 10**9, "--checkpoint-every", str(10**9), "--log-every", str(10**9)),
    )
    # Progress comes from the training loop itself: the ranks are past their set-up.
    wait_until(
        lambda: (home.show(job_id)["progress"] or {}).get("fraction", 0) > 0,
        f"training to report progress ({how})",
        timeout=180,
    )
    preempt(home, job_id)
    ended = home.wait_state(job_id, "cancelled", "failed", "succeeded", timeout=120)
    log = logs(home, job_id)
    assert f"resumed from step {last_step}" in log, log
    found = re.search(rf"preempted by signal {int(signum)} at step (\d+); checkpoint saved", log)
    assert found, f"{how}: " + log + home.run("logs", "--stderr", str(job_id)).stdout
    assert saved_step(ckpt) == int(found.group(1)) > last_step
    # torchrun exits 1 after passing a signal on; a cancelled job is cancelled whatever.
    assert ended["state"] == ("cancelled" if how == "cancel" else "failed"), how
    return int(found.group(1))


def check_nightly_eval_passes_the_status_on(home, ckpt: Path, step: int) -> None:
    """jobs/nightly_eval.sh as cron runs it: a loss threshold of 0 must fail, with status 1."""
    env = {
        **home.env,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHON": sys.executable,
        "CHECKPOINT_DIR": str(ckpt),
        "MAX_LOSS": "0",
    }
    proc = subprocess.run(
        [str(REPO / "jobs" / "nightly_eval.sh")],
        env=env,
        text=True,
        capture_output=True,
        timeout=180,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(rf"eval loss [\d.]+ at step {step}\n", proc.stdout), proc.stdout
    assert "is above --max-loss 0.0" in proc.stderr
    assert re.search(r"nightly eval \(job \d+\) ended with status 1", proc.stdout)


def job_process_group(home, job_id: int) -> int:
    """The job's process group: the shim makes the job (here torchrun) its leader.

    Found as a child of this home's shim: not by the environment, which torchrun's
    workers, each the leader of a session of its own, share (and the jobs of other test
    runs on the machine, but for GPUSCHED_HOME).
    """

    def leader() -> int | None:
        shim = find_shim(home.state / "jobs", job_id)
        try:
            children = psutil.Process(shim[0]).children() if shim else []
            return next((c.pid for c in children if os.getpgid(c.pid) == c.pid), None)
        except (psutil.Error, ProcessLookupError):
            return None

    return wait_until(leader, f"job {job_id}'s process group")


def send_warning_signal(home, job_id: int) -> None:
    """What the daemon does before a time limit: the warning signal to the job's group."""
    os.killpg(job_process_group(home, job_id), signal.SIGUSR1)


def cancel(home, job_id: int) -> None:
    home.run("cancel", str(job_id))


def nothing(home, job_id: int) -> None:
    pass


# Each way a running job is told to stop, tried in this order: (submit options, what the
# test does once training runs, the signal the job should see). When `submit --time` and
# `--signal` exist, add ("--time", "1m", "--signal", "USR1@50s"), nothing, SIGUSR1.
PREEMPTIONS = {
    "warning-signal": ((), send_warning_signal, signal.SIGUSR1),
    "cancel": ((), cancel, signal.SIGTERM),
}
