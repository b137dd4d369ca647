"""Arrays as Slurm users script them: `submit --array` prints the array's id (as
`sbatch --parsable`), elements see their array's count, min, max and step, and a dependency
reason names the element that failed."""

from __future__ import annotations

from conftest import wait_until


def test_submit_array_prints_the_array_id_for_scripts(home):
    home.start()
    out = home.run("submit", "--array", "0-3", "--", "true").stdout
    assert out.count("\n") == 1  # one id, not one per element
    array_id = out.strip()
    after = home.run("submit", "-d", f"afterok:{array_id}", "--", "true").stdout.strip()
    home.run("wait", array_id, after)
    assert home.show(int(after))["state"] == "succeeded"


def test_elements_see_the_arrays_count_min_max_and_step(home):
    home.start()
    array_id = home.run(
        "submit",
        "--array",
        "3-15:4",
        "--",
        "sh",
        "-c",
        "echo $GPUSCHED_ARRAY_COUNT $GPUSCHED_ARRAY_MIN $GPUSCHED_ARRAY_MAX $GPUSCHED_ARRAY_STEP",
    ).stdout.strip()
    home.run("wait", array_id)
    assert home.run("logs", f"{array_id}_7").stdout.strip() == "4 3 15 4"
    uneven = home.run(
        "submit",
        "--array",
        "1,2,5",
        "--",
        "sh",
        "-c",
        "echo $GPUSCHED_ARRAY_COUNT $GPUSCHED_ARRAY_STEP",
    ).stdout.strip()
    home.run("wait", uneven, check=False)
    assert home.run("logs", f"{uneven}_5").stdout.strip() == "3 1"


def test_a_dependency_reason_names_the_element_that_failed(home):
    home.start()
    array_id = int(
        home.run(
            "submit", "--array", "0-2", "--", "sh", "-c", "exit $((GPUSCHED_ARRAY_INDEX == 1))"
        ).stdout
    )
    waiting = home.submit("-d", f"afterok:{array_id}", "--", "true")
    home.run("wait", str(array_id), check=False)
    failed = next(j for j in home.jobs() if j.get("array_index") == 1)
    reason = wait_until(
        lambda: "never" in (r := home.show(waiting)["pending_reason"]) and r,
        "the dependency to be found unmet",
    )
    # Before: "job <array id> ended failed", though that element (index 0) succeeded.
    assert reason == (
        f"dependency afterok:{array_id} can never be met: element "
        f"{array_id}_1 (job {failed['id']}) ended failed"
    )
