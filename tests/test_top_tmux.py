"""`gpusched top` in a real terminal (tmux): its keys, and every way out leaves the shell usable."""

from __future__ import annotations

import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import uuid

import psutil
import pytest

from conftest import DEADLINE_S, is_gone, wait_until

TMUX = shutil.which("tmux")
pytestmark = pytest.mark.skipif(
    TMUX is None, reason="tmux is not installed (Debian package `tmux`; .ci/run installs it)"
)

COLUMNS, LINES = 120, 45


class Tmux:
    """One private tmux server (-L socket) with one window of a fixed size running bash."""

    def __init__(self, env: dict[str, str]):
        self.socket = f"gpusched-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        # COLUMNS/LINES from the test environment would override the window's real size.
        self.env = {
            k: v for k, v in env.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TMUX")
        }

    def cmd(self, *args: str) -> str:
        proc = subprocess.run(
            [TMUX, "-L", self.socket, "-f", "/dev/null", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )
        assert proc.returncode == 0, f"tmux {' '.join(args)}: {proc.stderr}"
        return proc.stdout

    def start(self, cwd: str, columns: int = COLUMNS, lines: int = LINES) -> None:
        shell = ["env", "PS1=$ ", "bash", "--norc", "--noprofile", "-i"]
        self.cmd(
            "new-session", "-d", "-s", "t", "-x", str(columns), "-y", str(lines), "-c", cwd, *shell
        )
        wait_until(lambda: self.screen().rstrip().endswith("$"), "the shell prompt")

    def screen(self, escapes: bool = False) -> str:
        """The visible screen; with escapes, its colours and attributes as SGR sequences."""
        return self.cmd("capture-pane", "-p", *(["-e"] if escapes else []), "-t", "t")

    def keys(self, *keys: str) -> None:
        self.cmd("send-keys", "-t", "t", *keys)

    def type_line(self, text: str) -> None:
        self.cmd("send-keys", "-t", "t", "-l", text)
        self.keys("Enter")

    def wait_for(self, pattern: str, what: str) -> str:
        """The screen once it matches `pattern`; fails with the last screen after the deadline."""
        last = [""]

        def matches() -> str | None:
            last[0] = self.screen()
            return last[0] if re.search(pattern, last[0], re.M) else None

        try:
            return wait_until(matches, what)
        except pytest.fail.Exception:
            pytest.fail(f"timed out waiting for {what} ({pattern!r}); the screen:\n{last[0]}")

    def shell_pid(self) -> int:
        return int(self.cmd("display-message", "-p", "-t", "t", "#{pane_pid}").strip())

    def children(self) -> list[psutil.Process]:
        return psutil.Process(self.shell_pid()).children()

    def kill(self) -> None:
        subprocess.run(
            [TMUX, "-L", self.socket, "kill-server"],
            env=self.env,
            capture_output=True,
            timeout=DEADLINE_S,
        )


@pytest.fixture
def term(home):
    """A tmux window whose shell has the home's environment, with a daemon and two jobs."""
    home.start()
    running = home.submit("--gpus", "1", "--name", "trainer", "--", "sleep", "300")
    home.wait_state(running, "running")
    home.submit("--gpus", "4", "--name", "waiter", "--", "true")
    tmux = Tmux(home.env)
    try:
        tmux.start(str(home.path))
        yield tmux
    finally:
        tmux.kill()


def start_top(term: Tmux) -> psutil.Process:
    term.type_line(f"{shlex.quote(sys.executable)} -m gpusched top --interval 0.5")
    term.wait_for(r"Running \(1\)", "top's first frame")
    return wait_until(lambda: term.children() and term.children()[0], "top's process")


def marker() -> tuple[str, str]:
    """A shell word typed as a product and printed as its value: a unique line to wait for."""
    a, b = random.randint(100, 999), random.randint(100, 999)
    return f"marker-$(({a}*{b}))-done", f"marker-{a * b}-done"


def assert_shell_usable_and_tty_sane(term: Tmux, top: psutil.Process) -> str:
    """Top's exit status, once the shell has run a command typed after top ended."""
    wait_until(lambda: is_gone(top), "top to exit")
    wait_until(lambda: not term.children(), "the shell to reap top")
    typed, printed = marker()
    term.type_line(f'echo "rc=$?"; stty -a; echo "{typed}"')
    # Only a shell that ran the line prints the marker, and the typed line on the screen
    # shows that echo is on.
    screen = term.wait_for(rf"^{printed}$", "the shell to run a command after top")
    assert typed in screen
    assert re.search(r"(?<![-\w])icanon\b", screen), screen
    assert re.search(r"(?<![-\w])echo\b", screen), screen
    assert "Running (1)" not in screen, "top's frame is still on the screen"
    return re.findall(r"^rc=(\d+)", screen, re.M)[-1]


def test_keys_drive_top_and_q_leaves_the_terminal_usable(term):
    top = start_top(term)
    screen = term.screen()
    assert "Pending (1)" in screen and "trainer" in screen and "waiter" in screen
    term.keys("?")
    term.wait_for(r"Help", "the help")
    term.keys("?")
    term.wait_for(r"Processes|Running \(1\)", "the help to close")
    term.keys("p")
    term.wait_for(r"PAUSED", "the pause mark")
    term.keys("u")
    term.wait_for(r"only mine", "the only-mine mark")
    term.keys("s")
    term.wait_for(r"sort: gpu-mem", "the next sort key")
    term.keys("q")
    assert assert_shell_usable_and_tty_sane(term, top) == "0"


def test_once_on_a_terminal_is_coloured_unless_no_color(term):
    command = f"{shlex.quote(sys.executable)} -m gpusched top --once"
    for prefix, expect_colour in (("", True), ("NO_COLOR=1 ", False)):
        typed, printed = marker()
        term.type_line(f'clear; {prefix}{command}; echo "{typed}"')
        term.wait_for(rf"^{printed}$", "top --once to print its frame")
        screen = term.screen(escapes=True)
        assert "Pending (1)" in screen
        assert ("\x1b[" in screen) is expect_colour, screen


def test_ctrl_c_and_sigterm_leave_the_terminal_usable(term):
    top = start_top(term)
    term.keys("C-c")
    assert assert_shell_usable_and_tty_sane(term, top) == "0"
    top = start_top(term)
    os.kill(top.pid, signal.SIGTERM)
    assert assert_shell_usable_and_tty_sane(term, top) == str(128 + signal.SIGTERM)


def test_a_full_box_on_an_80x24_terminal_still_shows_the_first_pending_job(make_home):
    # Eight GPUs and eight running jobs fill an 80x24 screen; what waits must still show.
    home = make_home("8x80GiB")
    home.start()
    running = [
        home.submit("--gpus", "1", "--name", f"busy{n}", "--", "sleep", "300") for n in range(8)
    ]
    for job_id in running:
        home.wait_state(job_id, "running")
    waiting = home.submit("--gpus", "2", "--name", "waiter", "--", "true")
    wait_until(
        lambda: home.show(waiting)["pending_reason"].startswith("needs"), "the pending reason"
    )
    tmux = Tmux(home.env)
    try:
        tmux.start(str(home.path), columns=80, lines=24)
        tmux.type_line(f"{shlex.quote(sys.executable)} -m gpusched top --interval 0.5")
        screen = tmux.wait_for(r"Running \(8\)", "top's first frame")
        assert "Pending (1)" in screen, screen
        assert re.search(rf"│ +{waiting} +\S+ +waiter +.* needs 2", screen), screen
        assert max(len(line) for line in screen.splitlines()) <= 80
        tmux.keys("q")
        tmux.wait_for(r"^\$\s*$", "the prompt after top")
    finally:
        tmux.kill()
