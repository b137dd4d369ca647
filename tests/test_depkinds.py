"""Slurm's dependency kinds singleton, aftercorr and `?` (any of), and --kill-on-invalid-dep,
end to end: the real CLI (its fast path, the typer path and #SBATCH lines) and a real
daemon in a temporary home. Jobs wait on files the test creates, never on sleeps."""

from __future__ import annotations

import pytest

from conftest import wait_until


def reason(home, job_id) -> str:
    return home.show(job_id)["pending_reason"]


def refused(home, *args, env=None) -> str:
    proc = home.run(*args, check=False, env=env)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    return proc.stderr


def gate(tmp_path, name: str, code: int = 0) -> list[str]:
    """A command that waits for the file `name`, then exits with `code`."""
    path = tmp_path / name
    return ["sh", "-c", f"while [ ! -e {path} ]; do sleep 0.05; done; exit {code}"]


@pytest.mark.parametrize("typer_path", [False, True])
def test_singleton_runs_one_job_of_a_name_at_a_time(home, tmp_path, typer_path):
    env = {"GPUSCHED_NO_FAST_PATH": "1"} if typer_path else {}
    home.start()
    first = int(home.run("submit", "-J", "sweep", "--", *gate(tmp_path, "go", 3), env=env).stdout)
    home.wait_state(first, "running")
    single = int(home.run("submit", "-J", "sweep", "-d", "singleton", "--", "true", env=env).stdout)
    other = int(
        home.run("submit", "-J", "other", "--dependency=singleton", "--", "true", env=env).stdout
    )
    home.wait_state(other, "succeeded")  # no other job of its name
    wait_until(
        lambda: reason(home, single).startswith("waiting for singleton"), "the singleton's reason"
    )
    assert reason(home, single) == (
        f"waiting for singleton (job {first}, also named 'sweep', is running)"
    )
    assert home.show(single)["dependencies"] == ["singleton"]
    listing = home.run("ls", env=env).stdout
    assert f"waiting for singleton (job {first}" in listing
    assert "dependencies=singleton" in home.run("show", str(single), env=env).stdout
    (tmp_path / "go").touch()  # the first one fails: singleton waits for any end
    assert home.wait_state(first, "failed")["exit_code"] == 3
    home.wait_state(single, "succeeded")


def test_singleton_from_sbatch_lines_waits_behind_an_earlier_held_job(home, tmp_path):
    """A held job of the name, waiting ahead of it, holds a singleton back (as in Slurm)."""
    home.start()
    held = home.submit("--hold", "-J", "nightly", "--", "true")
    script = tmp_path / "nightly.sh"
    script.write_text(
        "#!/bin/sh\n#SBATCH --job-name=nightly\n#SBATCH --dependency=singleton\ntrue\n"
    )
    script.chmod(0o755)
    single = int(home.run("submit", "--", str(script)).stdout)
    wait_until(
        lambda: reason(home, single).startswith("waiting for singleton"), "the singleton's reason"
    )
    assert f"job {held}, also named 'nightly', is pending" in reason(home, single)
    home.run("release", str(held))
    home.wait_state(held, "succeeded")
    home.wait_state(single, "succeeded")


def test_any_of_starts_on_the_first_dependency_met(home, tmp_path):
    home.start()
    failing = home.submit("--", "false")
    slow = home.submit("--", *gate(tmp_path, "go"))
    home.wait_state(failing, "failed")
    either = home.submit("-d", f"afterok:{failing}?afterok:{slow}", "--", "true")
    other = int(
        home.run(
            "submit",
            "-d",
            f"afternotok:{failing}?afterok:{slow}",
            "--",
            "true",
            env={"GPUSCHED_NO_FAST_PATH": "1"},
        ).stdout
    )
    home.wait_state(other, "succeeded")  # afternotok on the failed job is met
    wait_until(lambda: reason(home, either) == f"waiting for afterok:{slow}", "the any-of reason")
    assert home.show(either)["dependencies"] == [f"afterok:{failing}?afterok:{slow}"]
    (tmp_path / "go").touch()
    home.wait_state(either, "succeeded")


@pytest.mark.parametrize("kill, state", [("yes", "cancelled"), ("no", "pending")])
def test_any_of_never_met_follows_kill_on_invalid_dep(home, kill, state):
    home.start()
    failing, ok = home.submit("--", "false"), home.submit("--", "true")
    child = home.submit(
        f"--kill-on-invalid-dep={kill}", "-d", f"afterok:{failing}?afternotok:{ok}", "--", "true"
    )
    why = (
        f"dependency afterok:{failing}?afternotok:{ok} can never be met: job {failing} "
        f"ended failed; job {ok} ended succeeded"
    )
    seen = wait_until(
        lambda: (
            (j := home.show(child))["end_reason" if kill == "yes" else "pending_reason"] == why
            and j
        ),
        "the verdict",
    )
    assert seen["state"] == state
    if kill == "no":
        home.run("cancel", str(child))


def test_mixing_all_of_and_any_of_is_refused_in_one_line(home):
    home.start()
    first = home.submit("--", "true")
    for env in ({}, {"GPUSCHED_NO_FAST_PATH": "1"}):
        err = refused(
            home,
            "submit",
            "-d",
            f"afterok:{first},afterok:{first}?afterany:{first}",
            "--",
            "true",
            env=env,
        )
        assert err.startswith("Error: --dependency ") and "mixes '?' (any of) with ','" in err
    assert [j["id"] for j in home.jobs()] == [first]


@pytest.mark.parametrize("kill", ["no", "yes"])
def test_aftercorr_pairs_elements_of_two_arrays(home, tmp_path, kill):
    """Element N waits on element N; element 1's failed, so 1 never runs; element 4 has
    no partner, so it waits on the whole array, which failed: both as Slurm does."""
    home.start()
    gate_cmd = (
        f'while [ ! -e {tmp_path}/go ]; do sleep 0.05; done; [ "$GPUSCHED_ARRAY_INDEX" != 1 ]'
    )
    parents = home.json("submit", "--array", "0-3", "--", "sh", "-c", gate_cmd)["ids"][0]
    children = home.json(
        "submit",
        "--array",
        "0-4",
        f"--kill-on-invalid-dep={kill}",
        "-d",
        f"aftercorr:{parents}_2",
        "--",
        "true",
    )["ids"]
    assert home.show(children[0])["dependencies"] == [f"aftercorr:{parents}"]
    wait_until(
        lambda: reason(home, children[2]) == f"waiting for aftercorr:{parents}_2",
        "an element to wait on its partner",
    )
    (tmp_path / "go").touch()
    for index in (0, 2, 3):
        home.wait_state(children[index], "succeeded")
    never = {
        1: f"element {parents}_1 ended failed",
        4: f"element {parents}_1 (job {parents + 1}) ended failed",
    }
    for index, words in never.items():
        seen = wait_until(
            lambda: (
                (
                    (j := home.show(children[index]))  # noqa: B023 - called within this turn of the loop["state"] != "pending"
                    or "can never be met" in j["pending_reason"]
                )
                and j
            ),
            "the verdict",
        )
        assert seen["state"] == ("cancelled" if kill == "yes" else "pending")
        assert (
            seen["end_reason"] or seen["pending_reason"]
        ) == f"dependency aftercorr:{parents} can never be met: {words}"
    home.run("cancel", *map(str, children), check=False)
