"""Right-sizing in `gpusched history` and `usage`: GPU memory asked for against the peak
used, per run and per user, and the share of runs that asked for more than twice their peak
(the daemon in this process, tests/inproc.py, on simulated GPUs)."""

from __future__ import annotations

import pytest

from gpusched.cli.commands.history_cmds import history_text
from gpusched.cli.commands.usage_cmds import usage_text
from gpusched.core.sched import rightsize

GIB = 2**30


def _run_with_peak(box, peak: str, *ask: str) -> int:
    job_id = box.submit(
        "--name", "train", *ask, "--env", f"GPUSCHED_SIM_MEM_USED={peak}", "--", "train"
    )
    box.step()
    box.step(box.daemon.settings.gpu_poll_interval_s)  # a GPU reading records its peak
    assert box.exit(job_id, 0)["state"] == "succeeded"
    return job_id


@pytest.fixture
def sized(make_box):
    box = make_box("1x80GiB")
    _run_with_peak(box, "10G", "--gpu-mem", "40G")  # asked for 4x its peak
    _run_with_peak(box, "15G", "--gpu-mem", "20G")  # close to it
    _run_with_peak(box, "30G", "--gpus", "1")  # a whole 80 GiB GPU for 30 GiB
    unread = box.submit("--name", "train", "--gpu-mem", "40G", "--", "train")
    box.step()
    box.exit(unread, 0)  # ended before any GPU reading: no peak, not counted
    return box


def test_history_shows_each_runs_ask_against_its_peak(sized):
    report = sized.call("history", key="train")
    asked = [run["gpu_mem_asked_bytes"] for run in report["runs"]]
    assert asked == [40 * GIB, 80 * GIB, 20 * GIB, 40 * GIB]  # newest first; whole GPU: 80
    assert report["right_sizing"] == {
        "jobs": 3,
        "asked_bytes": 140 * GIB,
        "peak_bytes": 55 * GIB,
        "over_asked": 2,
        "over_asked_share": 2 / 3,
    }
    text = history_text(report)
    # 55 GiB of peaks against 140 GiB asked for.
    assert "2 of 3 runs asked for over twice their GPU memory peak; peaks were 39% of asks" in text
    header, *rows = text.splitlines()[:5]
    assert header.split()[-1] == "PEAK/ASK"
    assert [row.split()[-1] for row in rows] == ["-", "38%", "75%", "25%"]
    assert max(len(line) for line in text.splitlines()[:5]) <= 80


def test_usage_sums_asks_and_peaks_per_user(sized):
    report = sized.call("usage")
    (me,) = report["groups"]
    assert me["right_sizing"]["jobs"] == 3 and me["right_sizing"]["over_asked"] == 2
    assert report["total"]["right_sizing"] == me["right_sizing"]
    assert sized.call("usage", by="name")["groups"][0]["right_sizing"]["asked_bytes"] == 140 * GIB
    header, line = usage_text(report).splitlines()[1:3]
    cells = dict(
        zip(header.replace("MEM GiB-H", "MEM").replace("MEAN WAIT", "WAIT").split(), line.split())
    )
    assert (cells["PEAK/ASK"], cells["ASK>2X"]) == ("39%", "2/3")


def test_a_whole_gpu_no_longer_seen_asks_for_nothing_known():
    totals = {"GPU-a": 80 * GIB, "GPU-b": 40 * GIB}
    assert rightsize.asked_bytes(None, ["GPU-a", "GPU-b"], totals) == 40 * GIB  # the smaller
    assert rightsize.asked_bytes(None, ["GPU-a", "GPU-gone"], totals) is None
    assert rightsize.asked_bytes(None, [], totals) is None  # never started
    assert rightsize.asked_bytes(10 * GIB, ["GPU-gone"], totals) == 10 * GIB


def test_usage_fits_a_narrow_terminal_and_keeps_the_right_sizing(sized):
    lines = usage_text(sized.call("usage"), width=56).splitlines()[1:]
    assert max(len(line) for line in lines) <= 56
    assert lines[0].split()[-3:] == ["PEAK/ASK", "ASK>2X", "STATES"]
    assert lines[1].split()[-4:-2] == ["39%", "2/3"]
