"""`gpusched demo`, the README's first command, run as a user runs it: it shows what each job
printed, every frame tells the truth, and it leaves nothing behind."""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import CONSOLE_SCRIPT, DEADLINE_S, REPO

pytestmark = pytest.mark.e2e


def test_the_demo_shows_what_its_jobs_printed_and_cleans_up(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp),
        "PYTHONPATH": str(REPO),
        "COLUMNS": "100",
        "NO_COLOR": "1",
    }
    proc = subprocess.run(
        [str(CONSOLE_SCRIPT), "demo"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=3 * DEADLINE_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    frames = proc.stdout.split("\n-- t = ")[1:]
    assert frames
    last_gpus = {}
    for frame in frames:
        for line in frame.splitlines():
            cells = line.split()
            if (
                len(cells) > 5
                and cells[0].isdigit()
                and cells[3] in ("pending", "running", "succeeded")
            ):
                # A pending job holds no GPU in any frame (once one showed GPU 0).
                gpus = re.search(r"\s(-|[\d,]+)\s+1\s", line).group(1)
                assert cells[3] != "pending" or gpus == "-", line
                last_gpus[cells[2]] = gpus
    printed = dict(re.findall(r"^  job \d+ (\S+)\s+(?:GPU ([\d,]+)|no GPU)", proc.stdout, re.M))
    assert len(printed) == 8, proc.stdout
    # Each job printed the GPUs it was given (its CUDA_VISIBLE_DEVICES), none for the CPU job.
    assert printed == {name: ("" if gpus == "-" else gpus) for name, gpus in last_gpus.items()}
    assert printed["eval-cpu"] == ""
    assert list(tmp.iterdir()) == []  # its home removed
