"""A full disk, for the state directory (queue and logs) and for the logs alone: the
daemon stays up, no acked job is lost or hangs, and a refused submit never runs."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from reliability.harness import Figures, Home, is_gone, poll
from reliability.jobwatch import ENDED

TMPFS_SIZE = "2m"


@contextmanager
def small_disk(path: Path) -> Iterator[str]:
    """A 2 MiB tmpfs at PATH; yields "" or why it cannot be had (not root, no mount)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        yield "needs root to mount a small tmpfs"
        return
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        yield f"cannot mount a tmpfs: {done.stderr.strip()}"
        return
    try:
        yield ""
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path, leave_bytes: int) -> Path:
    """A file that takes all but leave_bytes of PATH's filesystem."""
    stat = os.statvfs(path)
    filler = path / "filler"
    with open(filler, "wb") as fh:
        fh.write(b"\0" * max(0, stat.f_bavail * stat.f_frsize - leave_bytes))
    return filler


class Run:
    """Submits while the disk is full; what was acked, refused, and which daemons served."""

    def __init__(self, home: Home, fig: Figures, key: str):
        self.home, self.fig, self.key = home, fig, key
        self.acked: dict[str, int] = {}
        self.refused: set[str] = set()
        self.pid: int | None = None
        self.crashes = 0
        self.runs = home.path / "runs"  # outside the full disk

    def submit(self, token: str, command: str, *options: str) -> None:
        proc = self.home.cli(
            "submit",
            *options,
            "--name",
            token,
            "--",
            "sh",
            "-c",
            f"echo {token} >> {self.runs}; {command}",
        )
        if proc.returncode == 0 and proc.stdout.strip().isdigit():
            self.acked[token] = int(proc.stdout)
        else:
            self.refused.add(token)
        if "could not start" in proc.stderr:  # the daemon the submit started died at once
            self.crashes += 1
        if self.home.jobs() is None:
            self.fig.fail(f"{self.key}_reads_failed", f"ls failed after {token}")
        self.watch_daemon()

    def watch_daemon(self) -> None:
        """Count the daemon we knew dying (nobody asked it to stop)."""
        if self.pid is not None and is_gone(self.pid):
            self.crashes += 1
            self.pid = None
        if self.pid is None:
            self.pid = self.home.daemon_pid()

    def check(self) -> None:
        """After space returned: crashes, hung and lost jobs, refused jobs that ran."""
        fig, key = self.fig, self.key
        self.watch_daemon()
        self.home.start()
        fig.fail(f"{key}_daemon_crashes", by=self.crashes)
        ids = set(self.acked.values())
        jobs = (
            poll(
                lambda: (
                    (js := self.home.jobs()) is not None
                    and all(j["state"] in ENDED for j in js if j["id"] in ids)
                    and js
                ),
                60,
            )
            or self.home.jobs()
            or []
        )
        by_id = {job["id"]: job for job in jobs}
        for token, job_id in self.acked.items():
            job = by_id.get(job_id)
            if job is None or job["name"] != token:
                fig.fail(
                    f"{key}_acked_lost",
                    f"{token} acked as {job_id}, stored as {job and job['name']}",
                )
            elif job["state"] not in ENDED:
                fig.fail(f"{key}_hung_jobs", f"job {job_id} still {job['state']}")
        ran = set(self.runs.read_text().split()) if self.runs.exists() else set()
        for token in sorted(self.refused & ran):
            fig.fail(f"{key}_refused_ran", f"{token}: submit refused, yet it ran")
        fig.info[f"{key}_acked"] = len(self.acked)
        fig.info[f"{key}_refused"] = len(self.refused)


def _state_full(home: Home, run: Run) -> None:
    filler = fill(home.state, 64 * 1024)
    big_env = "x" * 4096  # each job's stored environment eats the last space
    for n in range(12):
        run.submit(f"s{n}", "exit 0", "--env", f"PAD={big_env}")
    filler.unlink()


def _logs_full(home: Home, run: Run) -> None:
    for n in range(6):  # each writes 1 MiB of output: the 2 MiB fill at once, then the rest
        run.submit(f"l{n}", "head -c 1048576 /dev/zero", "--gpus", "0")
    filler = fill(home.state / "jobs", 0)
    for n in range(6, 12):
        run.submit(f"l{n}", "echo hello", "--gpus", "0")
    filler.unlink()


def _scenario(fig: Figures, key: str, small_dir: str, submits: Callable[[Home, Run], None]) -> None:
    """A home whose SMALL_DIR (under the state directory) is the small disk."""
    home = Home(f"df{key}")
    with small_disk(home.state / small_dir) as why:
        if why:
            fig.skipped = why
            return
        try:
            run = Run(home, fig, key)
            run.pid = home.start()
            submits(home, run)
            run.check()
        finally:
            home.close()


def measure() -> Figures:
    fig = Figures(f"disk full ({TMPFS_SIZE} tmpfs for the state directory, then for the logs)")
    for key in ("state", "logs"):
        for what in ("daemon_crashes", "hung_jobs", "acked_lost", "refused_ran", "reads_failed"):
            fig.counts[f"{key}_{what}"] = 0
    _scenario(fig, "state", "", _state_full)
    if not fig.skipped:
        _scenario(fig, "logs", "jobs", _logs_full)
    return fig
