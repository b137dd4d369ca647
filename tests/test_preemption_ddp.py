"""jobs/train_ddp.py preempted by a more urgent job under a real daemon (a higher priority,
or under las a new job in an earlier queue): it checkpoints on the signal, goes back to the
queue, and resumes from its checkpoint to the same final step."""

from __future__ import annotations

import re

import pytest

from conftest import wait_until

pytest.importorskip("torch")
from test_jobs_train import saved_step, torchrun_command

# About ten seconds of training on a small CPU: time enough to be preempted midway.
STEPS = 1200


# Under las the training job leaves the first queue after 2 GPU-seconds (1 s on its two
# GPUs), so that a new job, which attained nothing, outranks it at once.
LAS = '[scheduling]\ndiscipline = "las"\nlas_thresholds = ["2s"]\n'


@pytest.mark.parametrize(
    ("config", "urgency"), [("", ("--priority", "10")), (LAS, ())], ids=["priority", "las"]
)
def test_ddp_training_is_preempted_requeued_and_resumes_from_its_checkpoint(
    make_home, tmp_path, config, urgency
):
    home = make_home("2x80GiB")
    home.write_config(
        config + '[preemption]\nmin_run_before_preempt = "1s"\n'
        "[jobs]\nmaster_port_min = 29801\nmaster_port_max = 29899\n"
    )
    ckpt = tmp_path / "ckpt"
    command = torchrun_command(
        ckpt, STEPS, "--checkpoint-every", str(10**9), "--log-every", str(10**9)
    )
    train = home.submit("--preemptible", *command)
    wait_until(
        lambda: (home.show(train)["progress"] or {}).get("fraction", 0) > 0,
        "training to report progress",
        timeout=180,
    )
    urgent = home.submit(
        "--gpus", "1", *urgency, "--", "sh", "-c", 'echo "urgent on $CUDA_VISIBLE_DEVICES"'
    )
    assert home.wait_state(urgent, "succeeded", timeout=120)["state"] == "succeeded"
    job = home.wait_state(train, "succeeded", "failed", timeout=240)
    log = home.run("logs", str(train)).stdout
    assert job["state"] == "succeeded", log + home.run("logs", "--stderr", str(train)).stdout
    assert job["restarts"] == 1 and job["attempt"] == 2 and job["preempted_by"] == urgent
    stopped = re.search(r"preempted by signal 10 at step (\d+); checkpoint saved", log)
    assert stopped, log
    step = int(stopped.group(1))
    assert 0 < step < STEPS
    # The second run started from the first's checkpoint, not from 0, and finished.
    assert log.count("starting from step 0") == 1
    assert f"resumed from step {step}" in log
    assert f"checkpoint saved at step {STEPS}" in log
    assert saved_step(ckpt) == STEPS
    assert f"preempted=job {train} at " in home.run("show", str(urgent)).stdout
