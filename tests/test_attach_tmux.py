"""`gpusched attach` in a real terminal (tmux): a Python prompt answered through it, a resize
the job sees, detach and attach again (the scrollback shown again), and every way out
leaves the shell's terminal as it was."""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys

import pytest

from conftest import wait_until
from test_top_tmux import TMUX, Tmux

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(TMUX is None, reason="tmux is not installed (Debian package `tmux`)"),
]

# A Python prompt that says its terminal's size whenever that changes (SIGWINCH).
REPL_SETUP = (
    "import os, signal\n"
    "signal.signal(signal.SIGWINCH, lambda *_: print('size=%dx%d' % tuple(os.get_terminal_size())))\n"
)


def shell_line_after(term: Tmux, what: str) -> str:
    """The screen once the shell ran a line typed after `what`: its $? and stty's words."""
    term.type_line(
        'echo "rc=$?"; stty -a | tr " " "\\n" | grep -cxE -- "-icanon|-echo"; echo done-$((6*7))'
    )
    return term.wait_for(r"^done-42$", f"the shell to run a line after {what}")


def test_a_python_prompt_through_attach_resize_detach_and_attach_again(home):
    home.start()
    job = home.submit("--pty", "--", "python3", "-q", "-i", "-c", REPL_SETUP)
    home.wait_state(job, "running")
    term = Tmux(home.env)
    attach = f"{shlex.quote(sys.executable)} -m gpusched attach {job}"
    try:
        term.start(str(home.path), columns=100, lines=30)
        term.type_line(attach)
        term.wait_for(r"^>>> ", "the Python prompt")
        term.type_line("print(6 * 7, 'answered')")
        term.wait_for(r"^42 answered$", "Python's answer")
        term.cmd("resize-window", "-t", "t", "-x", "90", "-y", "25")
        term.wait_for(r"size=90x25", "the job to see the new size")
        term.keys("C-]")
        term.wait_for(rf"detached from job {job}", "the detach")
        screen = shell_line_after(term, "detaching")
        # $? is attach's 0; raw mode is gone: no -icanon nor -echo in stty's words.
        assert re.search(r"^rc=0\n0$", screen, re.M), screen
        assert home.show(job)["state"] == "running"
        term.type_line("clear")
        term.wait_for(r"^\$\s*$", "a clear screen")
        term.type_line(attach)
        term.wait_for(r"^42 answered$", "the scrollback on attaching again")
        # SIGTERM ends attach, not the job, and the shell gets its terminal back.
        attaching = wait_until(lambda: term.children() and term.children()[0], "attach's process")
        os.kill(attaching.pid, signal.SIGTERM)
        term.wait_for(rf"SIGTERM ended attach; job {job} runs on", "attach to end")
        screen = shell_line_after(term, "a SIGTERM")
        assert re.search(rf"^rc={128 + signal.SIGTERM}\n0$", screen, re.M), screen
        assert home.show(job)["state"] == "running"
        term.type_line("clear")
        term.wait_for(r"^\$\s*$", "a clear screen")
        term.type_line(attach)
        term.wait_for(r"^42 answered$", "the scrollback on attaching a third time")
        term.type_line("exit(3)")
        term.wait_for(rf"^\[job {job} exited with code 3\]$", "the job's end")
        screen = shell_line_after(term, "the job's end")
        assert re.search(r"^rc=3\n0$", screen, re.M), screen
    finally:
        term.kill()
    assert home.wait_state(job, "failed")["exit_code"] == 3
