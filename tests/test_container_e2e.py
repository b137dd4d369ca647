"""Containers (issue 19), end to end: real podman containers run by a real daemon through
the real CLI. No image can be pulled here, so a tiny image is made from a static busybox,
in podman storage of the test session's own (never the machine's default storage).
Skipped, with the reason, where podman cannot run a container."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import Home, find_shim, wait_until
from gpusched.daemon.jobs import containers

pytestmark = pytest.mark.system  # real podman containers

IMAGE = "localhost/gpusched-test-busybox:1"
BUSYBOX = "/bin/busybox"  # Debian's busybox-static
APPLETS = ("sh", "sleep", "echo", "cat", "id", "pwd", "kill", "true", "test", "[", "touch")
PROBE_TIMEOUT_S = 120


def _limits() -> list[str]:
    """The container's limits, no higher than ours: without CAP_SYS_RESOURCE (a container
    running these tests) podman's defaults, raised above them, are refused."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[0], 4096)
    return [f'"nofile={nofile}:{nofile}"', f'"nproc={nproc}:{nproc}"']


def _write_configs(root: Path, runtime: str) -> dict[str, str]:
    (root / "storage.conf").write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{root}/graph"\nrunroot = "{root}/run"\n'
    )
    (root / "containers.conf").write_text(
        f"[containers]\ndefault_ulimits = [{', '.join(_limits())}]\n"
        f'[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n'
        f'tmp_dir = "{root}/tmp"\nruntime = "{runtime}"\n'
    )
    return {
        "CONTAINERS_CONF": str(root / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(root / "storage.conf"),
    }


def _podman(env: dict[str, str], *args: str, timeout: float = PROBE_TIMEOUT_S):
    return subprocess.run(
        ["podman", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _tiny_image(root: Path, env: dict[str, str]) -> None:
    rootfs = root / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy(BUSYBOX, rootfs / "bin" / "busybox")
    for applet in APPLETS:
        (rootfs / "bin" / applet).symlink_to("busybox")
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(root / "rootfs.tar"), "."], check=True)
    done = _podman(env, "import", str(root / "rootfs.tar"), IMAGE)
    if done.returncode != 0:
        pytest.skip(f"podman cannot import an image here: {done.stderr.strip()[-300:]}")


@pytest.fixture(scope="session")
def podman_env(tmp_path_factory: pytest.TempPathFactory):
    """The environment (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF) under which podman uses
    this session's own storage, holding IMAGE; the jobs get it from their submit."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (Debian: apt-get install podman catatonit)")
    if not os.path.exists(BUSYBOX):
        pytest.skip(f"no static busybox at {BUSYBOX} (Debian: apt-get install busybox-static)")
    root = tmp_path_factory.mktemp("podman")
    # podman will not start without its configured runtime: one that is installed
    env = _write_configs(root, "crun" if shutil.which("crun") else "runc")
    _tiny_image(root, env)
    why = ""
    # crun refuses hosts whose cgroup v2 holds controllers beside v1 ones (hybrid): runc
    # copes, where installed.
    for runtime in ("crun", "runc"):
        env = _write_configs(root, runtime)
        probe = _podman(env, "run", "--rm", "--init", "--network=host", IMAGE, "true")
        if probe.returncode == 0:
            break
        why += f" {runtime}: {probe.stderr.strip()[-200:]}"
    else:
        pytest.skip(f"podman cannot run a container here:{why}")
    yield env
    _podman(env, "rm", "--all", "--force", "--time=0")


def names_of_home(home: Home, env: dict[str, str]) -> list[str]:
    """The containers of this home's jobs, running or not."""
    done = _podman(env, "ps", "--all", "--format", "{{.Names}}")
    assert done.returncode == 0, done.stderr
    prefix = f"gpusched-{containers.home_token(str(home.state))}-"
    return [n for n in done.stdout.split() if n.startswith(prefix)]


def submit(home: Home, env: dict[str, str], *args: str) -> int:
    proc = home.run("submit", "--json", "--container", IMAGE, *args, env=env)
    return json.loads(proc.stdout)["id"]


def log_of(home: Home, job_id: int) -> str:
    return home.run("logs", str(job_id)).stdout


def test_a_container_job_sees_its_gpus_its_directory_and_exits_with_its_status(
    home: Home, podman_env: dict[str, str]
):
    proc = home.run(
        "submit",
        "--gpus",
        "2",
        "--env",
        "GREETING=hello there",
        "--container",
        IMAGE,
        "--wait",
        "--",
        "sh",
        "-c",
        'echo "CVD=$CUDA_VISIBLE_DEVICES NV=$NVIDIA_VISIBLE_DEVICES ID=$GPUSCHED_JOB_ID"; '
        'echo "G=$GREETING H=${HOME_ONLY:-unset} PWD=$(pwd)"; touch made-inside; '
        "echo to-stderr >&2; exit 3",
        check=False,
        env={**podman_env, "HOME_ONLY": "host value"},
    )
    assert proc.returncode == 3, proc.stderr  # --wait exits with the job's status
    job = home.json("ls", "--all")[-1]
    job = home.show(job["id"])
    assert job["state"] == "failed" and job["exit_code"] == 3 and job["signal"] is None
    out = log_of(home, job["id"])
    assert f"CVD={','.join(job['gpus'])} NV={','.join(job['gpus'])} ID={job['id']}" in out
    # --env reaches the container; the rest of the submitting environment does not.
    assert f"G=hello there H=unset PWD={home.path}" in out
    assert "to-stderr" in home.run("logs", "--stderr", str(job["id"])).stdout
    assert (home.path / "made-inside").exists()  # the working directory is the host's
    assert names_of_home(home, podman_env) == []  # removed at its end


def test_a_cancel_ends_a_container_job_as_a_plain_one_and_removes_it(
    home: Home, podman_env: dict[str, str]
):
    home.write_config('[daemon]\ncancel_grace = "3s"\n')
    in_box = submit(home, podman_env, "--", "sh", "-c", "echo started; exec sleep 1000")
    plain = home.submit("--", "sleep", "1000")
    home.wait_state(plain, "running")
    # Once the container's process runs: see the next test for a cancel before that.
    wait_until(lambda: "started" in log_of(home, in_box), "the container's process to run")
    home.run("cancel", str(in_box), str(plain))
    ended = [home.wait_state(i, "cancelled") for i in (in_box, plain)]
    assert [j["exit_code"] for j in ended] == [None, None] and ended[1]["signal"] == 15
    # Known: podman 4.3's client, run after other containers (in a parallel test run),
    # now and then misses the end of the container that the SIGTERM it passed on ended;
    # the job then ends at the grace period's SIGKILL, cancelled all the same.
    assert ended[0]["signal"] in (15, 9)
    assert names_of_home(home, podman_env) == []


def test_a_cancel_while_the_container_starts_still_cancels_it_and_removes_it(
    home: Home, podman_env: dict[str, str]
):
    # The runtime may lose a signal that comes before the container's process exists
    # (podman then exits 0, or passes on nothing): the grace period's SIGKILL ends it.
    home.write_config('[daemon]\ncancel_grace = "2s"\n')
    job_id = submit(home, podman_env, "--", "sleep", "1000")
    home.run("cancel", str(job_id))
    assert home.wait_state(job_id, "cancelled")["exit_code"] in (None, 0)
    assert names_of_home(home, podman_env) == []


def test_a_time_limit_ends_a_container_job_that_ignores_sigterm(
    home: Home, podman_env: dict[str, str]
):
    # The runtime's client is killed after the grace: the shim removes the container.
    home.write_config('[daemon]\ncancel_grace = "1s"\n')
    # A limit well past the container's start (seconds on a loaded machine): the trap is
    # set by the time the SIGTERM comes.
    job_id = submit(
        home,
        podman_env,
        "--time",
        "8s",
        "--",
        "sh",
        "-c",
        'trap "" TERM; echo started; while true; do sleep 1; done',
    )
    job = home.wait_state(job_id, "timeout")
    assert job["signal"] == 9
    assert "started" in log_of(home, job_id)  # the log is kept
    assert names_of_home(home, podman_env) == []


def test_the_signal_before_the_time_limit_reaches_the_container(
    home: Home, podman_env: dict[str, str]
):
    job_id = submit(
        home,
        podman_env,
        "--time",
        "40s",
        "--signal",
        "USR1@28",
        "--",
        "sh",
        "-c",
        'trap "echo got USR1; exit 0" USR1; echo waiting; while true; do sleep 1; done',
    )
    job = home.wait_state(job_id, "succeeded", "failed", "timeout", "cancelled")
    assert job["state"] == "succeeded", log_of(home, job_id)
    assert "waiting\ngot USR1" in log_of(home, job_id)
    assert names_of_home(home, podman_env) == []


def test_a_killed_daemon_leaves_no_container_once_the_job_ends(
    home: Home, podman_env: dict[str, str]
):
    job_id = submit(
        home, podman_env, "--", "sh", "-c", "while ! test -e go; do sleep 0.2; done; exit 4"
    )
    home.wait_state(job_id, "running")
    wait_until(lambda: names_of_home(home, podman_env), "the job's container to run")
    home.kill_daemon()
    (home.path / "go").touch()  # the job ends while no daemon runs
    wait_until(lambda: not names_of_home(home, podman_env), "the container to be removed")
    job = home.wait_state(job_id, "failed")  # a command starts the daemon again
    assert job["exit_code"] == 4


def test_a_killed_shim_leaves_no_container_once_the_job_is_lost(
    home: Home, podman_env: dict[str, str]
):
    home.write_config('[daemon]\ncancel_grace = "2s"\ngpu_poll_interval = "1s"\n')
    # It ignores SIGTERM: the daemon SIGKILLs what it left (the runtime's client too).
    job_id = submit(
        home, podman_env, "--", "sh", "-c", 'trap "" TERM; while true; do sleep 1; done'
    )
    home.wait_state(job_id, "running")
    wait_until(lambda: names_of_home(home, podman_env), "the job's container to run")
    pid, _ = wait_until(lambda: find_shim(home.state / "jobs", job_id), "the shim's pid")
    os.kill(pid, signal.SIGKILL)  # what it left is stopped by the daemon, by its run token
    job = home.wait_state(job_id, "lost")
    assert "vanished" in job["end_reason"]
    wait_until(lambda: not names_of_home(home, podman_env), "the container to be removed")


def test_show_and_resubmit_keep_the_container_on_both_command_paths(home: Home):
    # No runtime needed: the job is held, never started.
    job_id = home.submit(
        "--hold",
        "--container",
        "localhost/img:2",
        "--container-opt=--shm-size=1g",
        "--",
        "python",
        "t.py",
    )
    job = home.show(job_id)
    assert job["container"] == {"image": "localhost/img:2", "options": ["--shm-size=1g"]}
    assert job["command"] == ["python", "t.py"]
    fast = home.run("show", str(job_id)).stdout
    full = home.run("show", str(job_id), env={"GPUSCHED_NO_FAST_PATH": "1"}).stdout
    assert fast == full and "   container=localhost/img:2 --shm-size=1g\n" in fast
    again = home.json("resubmit", str(job_id), "--hold")["id"]
    assert home.show(again)["container"] == job["container"]
    plain = home.submit("--hold", "--", "true")
    assert home.show(plain)["container"] is None
    assert "container=" not in home.run("show", str(plain)).stdout


def test_without_the_runtime_the_job_fails_saying_so(home: Home, tmp_path: Path):
    # No podman on the job's PATH: the job cannot start, as a plain job with a typo.
    bare = tmp_path / "bin"
    bare.mkdir()
    proc = home.script(
        "submit",
        "--container",
        IMAGE,
        "--wait",
        "--",
        "true",
        check=False,
        env=home.user_env(path=str(bare)),
    )
    assert proc.returncode == 127
    assert f"no such command 'podman' in PATH ({bare})" in proc.stderr


def test_an_image_the_runtime_cannot_find_fails_the_job_with_its_words(
    home: Home, podman_env: dict[str, str]
):
    proc = home.run(
        "submit",
        "--container",
        "localhost/gpusched-no-such-image:1",
        "--wait",
        "--",
        "true",
        check=False,
        env=podman_env,
    )
    assert proc.returncode == 125  # the runtime's own failure
    job = home.json("ls", "--all")[-1]
    assert "gpusched-no-such-image" in home.run("logs", "--stderr", str(job["id"])).stdout
    assert names_of_home(home, podman_env) == []
