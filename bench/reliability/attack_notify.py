"""Notifications turned against the daemon: a hook that floods its output, a webhook that
drips its answer a header line a second, and (system mode, as root) a user's own hook
that never ends. Failures: another notification delayed past a bound or never sent, a
post not cut off at its deadline, the daemon's memory grown beyond a bound."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import psutil

from reliability.harness import Figures, Home, kill_all, poll, python_for_others
from reliability.unauthorized import TOOLS, System, two_users

DELAY_BOUND_S = 20.0  # another notification goes out within this of its job's end
GROWTH_BOUND_BYTES = 64 * 2**20  # the daemon's peak memory may grow this much, no more
POST_TIMEOUT_S = 2  # each dripping post is cut off at this
SLEEPER = "7202"  # seconds: the never-ending hook's sleep, to find and kill it by
MARK = '#!/bin/sh\ntouch "$1/$2-$GPUSCHED_JOB_ID"\n'


def measure(small: bool) -> Figures:
    fig = Figures("notifications under attack")
    fig.counts.update(
        notifications_late=0,
        notifications_never_sent=0,
        posts_not_cut_off=0,
        daemon_memory_growth=0,
    )
    _flood_and_drip(fig, jobs=4 if small else 8, flood_mib=256 if small else 1024)
    if os.geteuid() != 0 or not all(shutil.which(t) for t in TOOLS):
        fig.notes.append(f"the never-ending user hook needs root and {', '.join(TOOLS)}")
    elif (found := python_for_others()) is None:
        fig.notes.append("the never-ending user hook: no interpreter others may run")
    else:
        _never_ending(fig, *found)
    return fig


# -- user mode: a flooding hook and a dripping webhook beside a plain hook ---------------------
def _flood_and_drip(fig: Figures, jobs: int, flood_mib: int) -> None:
    out = Path(tempfile.mkdtemp(prefix="gs-rel-notify-"))
    mark = out / "mark.sh"
    mark.write_text(MARK)
    mark.chmod(0o755)
    drip = _Dripping()
    home = Home(
        "notify",
        config=(
            f'[[notify]]\nevents = ["end"]\ncommand = ["sh", "-c", "head -c {flood_mib}M '
            '/dev/zero"]\n\n'
            f'[[notify]]\nevents = ["end"]\nurl = "http://127.0.0.1:{drip.port}/hook"\n'
            f'timeout = "{POST_TIMEOUT_S}s"\nretries = 0\n\n'
            f'[[notify]]\nevents = ["end"]\ncommand = ["{mark}", "{out}", "mark"]\n'
        ),
    )
    try:
        pid = home.start()
        if not pid:
            fig.skipped = "the daemon did not start"
            return
        before = _peak_rss(pid)
        ids = [home.cli("submit", "--", "true").stdout.strip() for _ in range(jobs)]
        _count_delays(fig, lambda job: out / f"mark-{job}", ids, lambda: home.jobs() or [])
        grown = _peak_rss(pid) - before
        fig.info.update(
            flood_mib_per_hook=flood_mib,
            hooks=jobs,
            daemon_peak_growth_mib=round(grown / 2**20, 1),
            dripping_posts=drip.posts,
        )
        if grown > GROWTH_BOUND_BYTES:
            fig.fail("daemon_memory_growth", f"peak RSS grew {grown} bytes")
        cut = poll(lambda: drip.cut_off >= jobs, POST_TIMEOUT_S * jobs + 30)
        if not cut:
            fig.fail(
                "posts_not_cut_off",
                f"{jobs - drip.cut_off} of {jobs} posts still open",
                by=jobs - drip.cut_off,
            )
    finally:
        home.close()
        drip.close()
        shutil.rmtree(out, ignore_errors=True)


def _count_delays(fig: Figures, marker, ids: list[str], listing) -> None:
    """Each job's marker hook must run within DELAY_BOUND_S of the job's end."""
    ended: dict[str, float] = {}
    deadline = time.monotonic() + DELAY_BOUND_S + 40
    while time.monotonic() < deadline and len(ended) < len(ids):
        done = {str(j["id"]): j["ended_at"] for j in listing() if j.get("ended_at")}
        for job in ids:
            if job not in ended and marker(job).exists() and job in done:
                ended[job] = marker(job).stat().st_mtime - done[job]
        time.sleep(0.2)
    worst = max([*ended.values(), fig.info.get("worst_notification_delay_s") or 0.0])
    fig.info["worst_notification_delay_s"] = round(worst, 2)
    for job in ids:
        if job not in ended:
            fig.fail("notifications_never_sent", f"job {job}'s hook did not run")
        elif ended[job] > DELAY_BOUND_S:
            fig.fail("notifications_late", f"job {job}'s hook ran {ended[job]:.1f} s after")


class _Dripping:
    """A webhook that reads the post and then answers a header line a second, forever."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.posts = self.cut_off = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            with self.lock:
                self.posts += 1
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                while True:
                    time.sleep(1.0)
                    conn.sendall(b"X-Drip: 1\r\n")
            except OSError:
                with self.lock:
                    self.cut_off += 1

    def close(self) -> None:
        self.server.close()


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


# -- system mode: a user's own hook that never ends ---------------------------------------------
def _never_ending(fig: Figures, python: str, pythonpath: str) -> None:
    """Alice's own hook sleeps for hours, with a timeout of hours, on each of her jobs'
    ends; the site's hook and bob's own must still run for bob's jobs within the bound."""
    system = System(python, pythonpath)
    out = Path(tempfile.mkdtemp(prefix="gs-rel-notify-", dir="/tmp"))
    out.chmod(0o777)
    mark = out / "mark.sh"
    mark.write_text(MARK)
    mark.chmod(0o755)
    etc = system.root / "etc/gpusched"
    etc.mkdir(parents=True)
    (etc / "gpusched.toml").write_text(
        '[system]\nuser_notify_timeout = "2h"\n\n'
        f'[[notify]]\nevents = ["end"]\ncommand = ["{mark}", "{out}", "site"]\n'
    )
    try:
        with two_users() as (alice, bob):
            try:
                _own_entries(alice, f'command = ["sleep", "{SLEEPER}"]\ntimeout = "2h"\n')
                _own_entries(bob, f'command = ["{mark}", "{out}", "own"]\n')
                if not system.start():
                    fig.notes.append("the never-ending user hook: the system daemon did not start")
                    return
                for _ in range(4):  # as many as the site had threads before
                    system.as_user(alice, "submit", "--", "true")
                poll(lambda: _sleepers(alice.pw_uid), 30)
                ids = [system.as_user(bob, "submit", "--", "true").stdout.strip() for _ in range(2)]
                for kind in ("site", "own"):
                    _count_delays(
                        fig,
                        lambda job, kind=kind: out / f"{kind}-{job}",
                        ids,
                        lambda: _json_list(system),
                    )
                fig.info["never_ending_hooks_running"] = len(_sleepers(alice.pw_uid))
            finally:  # not the daemon's processes: they run from no path of its root
                kill_all(_sleepers(alice.pw_uid))
    finally:
        system.close()
        shutil.rmtree(out, ignore_errors=True)


def _own_entries(user, command: str) -> None:
    folder = Path(user.pw_dir) / ".config/gpusched"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notify.toml").write_text(f'[[notify]]\nevents = ["end"]\n{command}')
    for path in (folder.parent, folder, folder / "notify.toml"):
        os.chown(path, user.pw_uid, user.pw_gid)
    (folder / "notify.toml").chmod(0o644)


def _sleepers(uid: int) -> list[psutil.Process]:
    return [
        p
        for p in psutil.process_iter(["uids", "cmdline"])
        if p.info["uids"] and p.info["uids"].real == uid and p.info["cmdline"] == ["sleep", SLEEPER]
    ]


def _json_list(system: System) -> list[dict]:
    proc = system.as_user(None, "ls", "--all", "--json")
    try:
        return json.loads(proc.stdout) if proc.returncode == 0 else []
    except ValueError:
        return []
