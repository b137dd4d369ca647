"""Job ids and Slurm's vocabulary through the real CLI and a real daemon.

ARRAY_INDEX ids (12_3) in every command that takes an id, ids that are refused without
touching the queue, `wait` on a whole array, `submit --json --array`, and the forms of
`submit`'s Slurm-named options as users type them (the pure parsing is in
tests/test_slurm_syntax.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DEADLINE_S, Home, wait_until
from gpusched.client.connection import Client
from gpusched.client.paths import resolve_paths

MiB = 2**20
MIXED = "2xH100-80GiB,2xA100-40GiB"
JOB_ID_COMMANDS = [
    ["show"],
    ["logs"],
    ["env"],
    ["wait"],
    ["hold"],
    ["release"],
    ["update", "--priority", "1"],
    ["cancel"],
]


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    """One daemon on a mixed box of 2 H100s and 2 A100s, shared by this module's tests."""
    home = Home(tmp_path_factory.mktemp("ids") / "home", MIXED)
    home.write_config('[daemon]\ncancel_grace = "0.5s"\n')
    yield home
    home.cleanup()


def client(home: Home) -> Client:
    return Client(resolve_paths(home.env), autostart=False)


def show(home: Home, job_id: int) -> dict:
    return client(home).call("show", ids=[job_id])["jobs"][0]


def queue(home: Home) -> list[dict]:
    return client(home).call("list", all=True)["jobs"]


def wait_state(home: Home, job_id: int, *states: str) -> dict:
    return wait_until(
        lambda: (j := show(home, job_id))["state"] in states and j,
        f"job {job_id} to reach {states}",
    )


def gate(path: Path) -> str:
    return f"while [ ! -e {path} ]; do sleep 0.05; done"


def refused(home: Home, *args: str, status: int = 2) -> str:
    """A command refused with one `Error:` line and the given status; returns the line."""
    proc = home.run(*args, check=False)
    assert proc.returncode == status, (args, proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.startswith("Error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    return proc.stderr


# -- ARRAY_INDEX in every command -----------------------------------------------------------
def test_every_command_that_takes_an_id_takes_array_index(box, tmp_path):
    home = box
    array = home.json(
        "submit", "--array", "0-2", "--", "sh", "-c", 'echo "out-$GPUSCHED_ARRAY_INDEX"'
    )["ids"][0]
    wait_state(home, array + 2, "succeeded")
    shown = home.json("show", f"{array}_1")
    assert (shown["id"], shown["array_id"], shown["array_index"]) == (array + 1, array, 1)
    assert home.run("logs", f"{array}_1").stdout == "out-1\n"
    assert home.json("env", f"{array}_1")["PATH"] == home.env["PATH"]
    assert home.run("wait", f"{array}_2").returncode == 0

    held = home.json("submit", "--hold", "--array", "0-2", "--", "true")["ids"][0]
    assert (
        home.run("update", f"{held}_2", "--priority", "5").stdout == f"job {held + 2}: priority 5\n"
    )
    assert home.run("release", f"{held}_1").stdout == f"job {held + 1}: released\n"
    wait_state(home, held + 1, "succeeded")
    refusal = home.run("hold", f"{held}_1", check=False)
    assert (refusal.returncode, refusal.stderr) == (
        1,
        f"Error: job {held + 1}: succeeded; only pending jobs can be held or released\n",
    )
    assert home.run("cancel", f"{held}_0").stdout == f"job {held}: cancelled\n"
    states = {j["id"]: (j["state"], j["priority"]) for j in queue(home)}
    assert [states[held + i] for i in range(3)] == [
        ("cancelled", 0),
        ("succeeded", 0),
        ("pending", 5),
    ]
    home.run("cancel", str(held))


@pytest.mark.parametrize("bad", ["5_", "_3", "5__3", "-1", "x", "4.5", "٣", "4_7_1"])
def test_a_bad_id_is_refused_by_every_command_and_changes_nothing(box, bad):
    home = box
    array = home.json("submit", "--hold", "--array", "0-2", "--", "true")["ids"][0]
    before = queue(home)
    ids = bad.replace("5", str(array))  # 5_ -> ARRAY_ (an empty index), x stays x
    for command in JOB_ID_COMMANDS:
        error = refused(
            home, command[0], *(["--"] if ids.startswith("-") else []), ids, *command[1:]
        )
        assert error.startswith(
            f"Error: '{ids}' is not a job id; give an ID like 12, or "
            "ARRAY_INDEX like 12_3 for one element of array 12"
        ), error
    # `cancel ${ARRAY}_${INDEX}` with an empty INDEX did not cancel the array.
    assert queue(home) == before
    home.run("cancel", str(array))


def test_cancel_with_an_empty_index_leaves_the_sweep_alone(box):
    """A script's `gpusched cancel ${ARRAY}_${INDEX}` with INDEX empty once cancelled the
    whole array."""
    home = box
    array = home.json("submit", "--hold", "--array", "0-2", "--", "true")["ids"][0]
    error = refused(home, "cancel", f"{array}_")
    assert error == (
        f"Error: '{array}_' is not a job id; give an ID like 12, or ARRAY_INDEX "
        "like 12_3 for one element of array 12\n"
    )
    assert [show(home, array + i)["state"] for i in range(3)] == ["pending"] * 3
    home.run("cancel", str(array))


def test_a_negative_id_is_named_as_such_not_as_an_option(box):
    for command in JOB_ID_COMMANDS:
        error = refused(box, command[0], "-1", *command[1:])
        assert error.startswith("Error: '-1' is not a job id; give an ID like 12"), error


def test_ids_that_name_no_job(box):
    home = box
    array = home.json("submit", "--hold", "--array", "0-1", "--", "true")["ids"][0]
    plain = home.submit("--hold", "--", "true")
    for command in JOB_ID_COMMANDS:
        assert f"array {array} has no element 7" in refused(
            home, command[0], f"{array}_7", *command[1:], status=1
        )
        assert f"job {plain} is not an array, so {plain}_0 names no job" in refused(
            home, command[0], f"{plain}_0", *command[1:], status=1
        )
    home.run("cancel", str(array), str(plain))


# -- wait on an array, submit --json --array ------------------------------------------------
def test_wait_on_an_array_waits_for_every_element_and_exits_with_the_first_failure(box, tmp_path):
    home = box
    script = (
        f"case $GPUSCHED_ARRAY_INDEX in 1) exit 3;; 2) {gate(tmp_path / 'go')};; 3) exit 7;; esac"
    )
    array = home.json("submit", "--array", "0-3", "--", "sh", "-c", script)["ids"][0]
    waiter = subprocess.Popen(
        [sys.executable, "-m", "gpusched", "wait", str(array)],
        env=home.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for element, state in ((0, "succeeded"), (1, "failed"), (3, "failed")):
            wait_state(home, array + element, state)
        assert waiter.poll() is None  # element 2 still runs
        (tmp_path / "go").touch()
        out, err = waiter.communicate(timeout=DEADLINE_S)
    finally:
        waiter.kill()
        waiter.wait()
    # Element 1 (exit 3) is the first that failed, in the array's order; 3 (exit 7) later.
    assert (waiter.returncode, out, err) == (3, "", "")
    assert all(show(home, array + i)["state"] in ("succeeded", "failed") for i in range(4))
    assert home.run("wait", f"{array}_3", check=False).returncode == 7
    assert home.run("wait", f"{array}_2", str(array + 3), check=False).returncode == 7
    assert home.run("wait", f"{array}_2").returncode == 0


def test_submit_json_gives_the_array_id(box):
    home = box
    array = home.json("submit", "--hold", "--array", "0-2", "--", "true")
    first = array["ids"][0]
    assert array == {"ids": [first, first + 1, first + 2], "array_id": first}
    one = home.json("submit", "--hold", "--array", "4", "--", "true")
    assert one == {"id": first + 3, "array_id": first + 3}
    assert home.json("submit", "--hold", "--", "true") == {"id": first + 4}
    home.run("cancel", str(first), str(first + 3), str(first + 4))


# -- --time ---------------------------------------------------------------------------------
def test_time_takes_slurms_forms_and_a_bare_number_is_minutes(box):
    home = box
    cases = {
        "2": 120.0,
        "1:30": 90.0,
        "1:02:03": 3723.0,
        "1-0": 86400.0,
        "1-2:30": 95400.0,
        "0-0:0:45": 45.0,
        "2h30m": 9000.0,
        "45s": 45.0,
        "0": None,
        "UNLIMITED": None,
        "infinite": None,
    }
    ids = {home.submit("--hold", "--time", text, "--", "true"): s for text, s in cases.items()}
    for job_id, seconds in ids.items():
        assert show(home, job_id)["time_limit_s"] == seconds
    home.run("cancel", *map(str, ids))
    before = queue(home)
    for text in ("1.5", "1-", "-1", "1:2:3:4", "soon"):
        assert refused(home, "submit", "--time", text, "--", "true").startswith(
            f"Error: --time {text!r} is not a time limit; use minutes (90), M:S, H:M:S"
        )
    assert "add a --time limit (not 0 or UNLIMITED)" in refused(
        home, "submit", "--time", "UNLIMITED", "--signal", "USR1", "--", "true"
    )
    assert queue(home) == before


def test_a_bare_time_limit_of_one_is_a_minute(box):
    """`--time 1` used to stop a job after one second; it is one minute, as in Slurm."""
    proc = box.run("submit", "--wait", "--time", "1", "--", "sleep", "2", check=False)
    assert (proc.returncode, proc.stderr) == (0, "")


# -- the other Slurm-named options ----------------------------------------------------------
def test_gpus_takes_slurms_type_and_count(box):
    home = box
    a100s = home.submit("--gpus", "a100:2", "--", "true")
    h100 = home.submit("-G", "H100:1", "--gpu-type", "h100", "--", "true")
    assert sorted(wait_state(home, a100s, "succeeded")["gpu_indices"]) == [2, 3]
    assert wait_state(home, h100, "succeeded")["gpu_indices"][0] in (0, 1)
    assert show(home, a100s)["constraints"]["gpu_type"] == "a100"
    assert "--gpus a100:1 and --gpu-type h100 name different GPU types" in refused(
        home, "submit", "--gpus", "a100:1", "--gpu-type", "h100", "--", "true"
    )
    assert "names several GPU types; a job takes one" in refused(
        home, "submit", "--gpus", "a100:1,h100:1", "--", "true"
    )
    assert "none of the 4 GPUs here meet them" in refused(
        home, "submit", "--gpus", "v100:1", "--", "true"
    )


def test_mem_cpus_per_task_job_name_and_chdir(box, tmp_path):
    home = box
    job_id = home.submit(
        "--hold",
        "--mem",
        "100",
        "--cpus-per-task",
        "2",
        "--job-name",
        "j",
        "--chdir",
        str(tmp_path),
        "--",
        "true",
    )
    job = show(home, job_id)
    assert (job["mem_bytes"], job["cpus"], job["name"], job["cwd"]) == (
        100 * MiB,
        2,
        "j",
        str(tmp_path),
    )
    assert show(home, home.submit("--hold", "--mem", "1.5G", "--", "true"))["mem_bytes"] == int(
        1.5 * 2**30
    )
    assert "--mem 0: Slurm's 0 (all of a node's memory) is not supported" in refused(
        home, "submit", "--mem", "0", "--", "true"
    )
    home.run("cancel", str(job_id), str(job_id + 1))


def test_kill_on_invalid_dep_takes_yes_or_no(box):
    home = box
    failed = home.submit("--", "false")
    wait_state(home, failed, "failed")
    killed = home.submit("-d", f"afterok:{failed}", "--kill-on-invalid-dep=yes", "--", "true")
    kept = home.submit(
        "-d", f"afterok:{failed}", "--kill-on-invalid-dep", "--", "--kill-on-invalid-dep=no"
    )  # the command's own argument
    spared = home.submit(
        "-d", f"afterok:{failed}", "--kill-on-invalid-dep", "--kill-on-invalid-dep=no", "--", "true"
    )
    assert wait_state(home, killed, "cancelled")["end_reason"].startswith(
        f"dependency afterok:{failed} can never be met"
    )
    wait_state(home, kept, "cancelled")
    reason = f"dependency afterok:{failed} can never be met: job {failed} ended failed"
    assert wait_until(lambda: show(home, spared)["pending_reason"] == reason, "the reason")
    assert "--kill-on-invalid-dep takes yes or no, not 'maybe'" in refused(
        home, "submit", "--kill-on-invalid-dep=maybe", "--", "true"
    )
    home.run("cancel", str(spared))


def test_signal_takes_slurms_prefixes(box):
    home = box
    job_id = home.submit("--hold", "--time", "5", "--signal", "R:USR2@30", "--", "true")
    job = show(home, job_id)
    assert (job["warn_signal"], job["warn_before_s"], job["time_limit_s"]) == (12, 30.0, 300.0)
    home.run("cancel", str(job_id))


# -- --dependency ---------------------------------------------------------------------------
def test_after_starts_once_the_job_started(box, tmp_path):
    home = box
    first = home.submit("--hold", "--", "sh", "-c", gate(tmp_path / "go"))
    second = home.submit("-d", f"after:{first}", "--", "true")
    assert (
        wait_until(lambda: show(home, second)["pending_reason"], "a reason")
        == f"waiting for after:{first}"
    )
    home.run("release", str(first))
    wait_state(home, second, "succeeded")
    assert show(home, first)["state"] == "running"  # it had only to start
    (tmp_path / "go").touch()
    wait_state(home, first, "succeeded")


def test_a_dependency_on_one_array_element(box, tmp_path):
    home = box
    array = home.json(
        "submit",
        "--array",
        "0-2",
        "--",
        "sh",
        "-c",
        f"while [ ! -e {tmp_path}/go.$GPUSCHED_ARRAY_INDEX ]; do sleep 0.05; done",
    )["ids"][0]
    after_one = home.submit("-d", f"afterok:{array}_1", "--", "true")
    after_all = home.submit("--after", str(array), "--", "true")
    assert show(home, after_one)["dependencies"] == [f"afterok:{array + 1}"]
    (tmp_path / "go.1").touch()
    wait_state(home, array + 1, "succeeded")
    wait_state(home, after_one, "succeeded")
    assert show(home, after_all)["state"] == "pending"  # elements 0 and 2 still run
    assert "array's own id" in refused(home, "submit", "-d", f"afterok:{array}_0", "--", "true")
    assert f"dependency on {array}_9: array {array} has no element 9" in refused(
        home, "submit", "-d", f"afterany:{array}_9", "--", "true"
    )
    for text, words in (
        (f"afterok:{array}?afterok:{after_one},after:{array}", "mixes '?'"),
        (f"after:{array}+5", "a delay after the start"),
        (f"afterok:{array}_", f"'{array}_' is not a job id"),
    ):
        assert words in refused(home, "submit", "-d", text, "--", "true")
    (tmp_path / "go.0").touch()
    (tmp_path / "go.2").touch()
    wait_state(home, after_all, "succeeded")


def test_json_of_show_for_an_element_is_the_element(box):
    home = box
    array = home.json("submit", "--hold", "--array", "3,5", "--", "true")["ids"][0]
    assert json.loads(home.run("show", "--json", f"{array}_5").stdout)["array_index"] == 5
    home.run("cancel", str(array))
