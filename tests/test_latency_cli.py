"""A long queue, end to end (issue 23): the real CLI against a real daemon in a temporary
home. Requests that only look leave the queue as it is, one that changes it still starts
jobs at once (no GPU reading due), and a big submit stored with the checkpoints off the
loop's thread is all there after a restart."""

from __future__ import annotations

from pathlib import Path

from conftest import Home

LINES = 3000  # over the size that goes in batches
# No GPU reading (nor the scheduling pass that follows one) while the test runs: only
# requests and job ends set off passes.
QUIET = '[daemon]\ngpu_poll_interval = "3600s"\n'


def test_a_long_queue_stays_usable_and_is_all_there_after_a_restart(home: Home, tmp_path: Path):
    home.write_config(QUIET)
    sweep = tmp_path / "sweep.txt"
    sweep.write_text("".join(f"echo {i}\n" for i in range(LINES)))
    ids = home.json("submit", "--hold", "--gpus", "0", "--from-file", str(sweep))["ids"]
    assert ids == list(range(ids[0], ids[0] + LINES))
    listing = home.run("ls").stdout
    assert "more pending" in listing, listing
    for _ in range(3):  # requests that only look: nothing moves
        assert home.show(ids[0])["state"] == "pending"
        home.run("gpus")
        home.run("daemon", "status")
    quick = home.submit("--gpus", "0", "--", "true")
    assert home.wait_state(quick, "succeeded")["exit_code"] == 0
    home.run("release", str(ids[5]))
    assert home.wait_state(ids[5], "succeeded")["exit_code"] == 0
    home.run("daemon", "stop")
    home.start()
    jobs = home.jobs()
    assert len(jobs) == LINES + 1
    assert home.show(ids[-1])["command"] == ["/bin/sh", "-c", f"echo {LINES - 1}"]
