"""The pure half of the Slurm hand-off: options to sbatch (or a refusal), Slurm's output
read back from a real Slurm 22.05's recordings (tests/fixtures/slurm_22.05)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.core.config import settings_from_mapping
from gpusched.core.errors import ConfigError
from gpusched.core.models import Constraints, Job, JobState, Request
from gpusched.core.slurm import slurmspec
from gpusched.core.slurm.clusterconf import ClusterConfig
from gpusched.core.slurm.slurmparse import (
    decode_wait_status,
    final_state,
    parse_record,
    parse_sacct,
    parse_squeue,
    record_outcome,
)

FIXTURES = Path(__file__).parent / "fixtures" / "slurm_22.05"
HPC = ClusterConfig(
    name="hpc",
    partition="gpu",
    account="lab",
    shared_dir="/shared/g",
    shared_roots=("/home",),
    gpu_types=(("a100", 40 * 2**30), ("h100", 80 * 2**30)),
)


def _job(**changes) -> Job:
    return Job(
        **{
            "id": 7,
            "command": ("python", "train.py"),
            "cwd": "/home/al/x",
            "uid": 0,
            "user": "al",
            **changes,
        }
    )


def test_squeue_rows_from_a_real_slurm_decode_raw_wait_statuses():
    rows = parse_squeue((FIXTURES / "squeue_O_all.txt").read_text())
    assert rows["34"].state == "FAILED" and rows["34"].exit_code == 42  # 10752 = 42 << 8
    assert rows["28"].state == "NODE_FAIL" and rows["28"].signal == 15
    assert rows["18"].reason == "DependencyNeverSatisfied" and rows["18"].node == ""
    assert rows["39"].comment == "gpusched:abc123:42" and rows["39"].started_at is not None
    assert all(row.is_final for row in rows.values())


def test_sacct_c_rows_read_code_and_signal():
    rows = parse_sacct((FIXTURES / "sacct_c.txt").read_text())
    assert (rows["9"].state, rows["9"].exit_code, rows["9"].signal) == ("FAILED", 3, None)
    assert (rows["10"].exit_code, rows["10"].signal) == (None, 9)
    assert rows["11"].state == "TIMEOUT"


@pytest.mark.parametrize(
    "status,decoded",
    [(768, (3, None)), (9, (None, 9)), (15, (None, 15)), (10752, (42, None)), (0, (0, None))],
)
def test_wait_statuses(status, decoded):
    assert decode_wait_status(status) == decoded


def test_the_state_comes_from_slurm_for_the_cause_and_from_the_exit_record_for_the_code():
    rows = parse_squeue((FIXTURES / "squeue_O_all.txt").read_text())
    assert final_state(rows["36"], {"status": "143"})[0] is JobState.TIMEOUT
    assert final_state(rows["18"], None)[0] is JobState.CANCELLED
    assert final_state(rows["28"], None)[0] is JobState.LOST
    assert final_state(rows["30"], {"status": "0"})[0] is JobState.SUCCEEDED
    # COMPLETED without the wrapper's record (a bad --chdir ran it in /tmp): never success.
    state, why = final_state(rows["30"], None)
    assert state is JobState.FAILED and "no exit record" in why
    record = parse_record("status=1 error=cannot enter the working directory")
    assert final_state(rows["30"], record) == (
        JobState.FAILED,
        "cannot enter the working directory",
    )
    assert record_outcome({"status": "137"}) == (None, 9, "")


def test_sbatch_argv_maps_every_option():
    job = _job(
        request=Request(gpus=2, gpu_mem_bytes=30 * 2**30, cpus=4, mem_bytes=10**9),
        time_limit_s=90.0,
        warn_signal=10,
        warn_before_s=30.0,
        priority=-5,
        name="tr",
    )
    argv = slurmspec.sbatch_argv(
        [job], HPC, "/shared/g/u/7.1.sh", "/o", "/e", "gpusched:u:7:1", [("afterok", "12")]
    )
    assert argv[0] == "sbatch" and argv[-1] == "/shared/g/u/7.1.sh"
    for expected in (
        "--gres=gpu:a100:2",
        "--cpus-per-task=4",
        "--mem=954M",
        "--time=2",
        "--signal=B:USR1@30",
        "--nice=5",
        "--dependency=afterok:12",
        "--comment=gpusched:u:7:1",
        "--kill-on-invalid-dep=yes",
        "--open-mode=append",
        "--partition=gpu",
        "--account=lab",
        "--export=NONE",
    ):
        assert expected in argv
    assert not any(a.startswith("--mem-per-gpu") for a in argv)  # host memory, not GPU's
    array = [_job(id=7 + i, array_id=7, array_index=i, array_throttle=2) for i in range(3)]
    assert "--array=0,1,2%2" in slurmspec.sbatch_argv(array, HPC, "/s", "/o", "/e", "m", [])


def test_sbatch_gets_a_job_name_of_one_line_even_from_a_program_named_with_a_newline():
    # A given --name with one is refused at submit (core/spec/jobspec.py); a program's file name
    # may hold any byte but NUL and '/', and would split Slurm's job-completion log line.
    job = _job(command=("/home/al/x/run\nJobId=1 UserId=root(0)", "a"))
    argv = slurmspec.sbatch_argv([job], HPC, "/s", "/o", "/e", "m", [])
    assert "--job-name=run?JobId=1 UserId=root(0)" in argv


@pytest.mark.parametrize(
    "changes,refused",
    [
        ({"cwd": "/srv/elsewhere"}, "is not under the directories"),
        ({"request": Request(gpus=1, constraints=Constraints(gpu_ids=(1,)))}, "--gpu-ids"),
        ({"request": Request(gpus=1, gpu_mem_bytes=100 * 2**30)}, "no GPU of cluster hpc has 100"),
        ({"priority": 3}, "--priority above 0"),
        ({"policy": "pack"}, "--policy"),
        ({"pty": True}, "--pty runs the job on a terminal of this machine"),
    ],
)
def test_what_has_no_slurm_meaning_is_refused_with_the_reason(changes, refused):
    assert refused in slurmspec.refusal(_job(**changes), HPC)


def test_wrapper_enters_the_directory_or_fails_and_forwards_signals():
    script = slurmspec.wrapper_script([_job()], "/shared/g/u", "/shared/g/u/7.env")
    assert "cd -- /home/al/x || { record exit" in script
    assert "trap 'kill -USR1 $child 2>/dev/null' USR1" in script


def test_env_file_keeps_any_value_and_drops_slurm_variables():
    data = slurmspec.env_file_bytes(
        {"FOO": "a b\nc", "SBATCH_TIMELIMIT": "7", "SLURM_JOB_ID": "3", "CUDA_VISIBLE_DEVICES": "0"}
    )
    assert data == b"FOO=a b\nc\0"


def test_clusters_config_names_bad_keys_and_the_default():
    settings = settings_from_mapping(
        {
            "default_cluster": "hpc",
            "clusters": {
                "hpc": {"shared_dir": "/shared", "gpu_types": {"a100": "40G"}, "poll_min": "1s"}
            },
        },
        "t.toml",
    )
    assert settings.default_cluster == "hpc"
    assert settings.clusters[0].gpu_types == (("a100", 40 * 2**30),)
    with pytest.raises(ConfigError, match=r"clusters\.hpc\.partiton"):
        settings_from_mapping({"clusters": {"hpc": {"shared_dir": "/s", "partiton": "x"}}}, "t")
    with pytest.raises(ConfigError, match="needs shared_dir"):
        settings_from_mapping({"clusters": {"hpc": {}}}, "t")
    with pytest.raises(ConfigError, match="valid: local, hpc"):
        settings_from_mapping(
            {"default_cluster": "hcp", "clusters": {"hpc": {"shared_dir": "/s"}}}, "t"
        )
