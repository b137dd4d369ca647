"""The commands' human output (cli/views/plainout.Screen, on the typer and the fast path
alike): styles on a terminal only, text from elsewhere printed as it is (never read as
markup or emoji codes, escapes shown, never sent raw), and cell widths as rich counts them."""

from __future__ import annotations

import io
import re

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len, set_cell_size

from gpusched.cli import jobviews
from gpusched.cli.views import lsview
from gpusched.cli.views.plainout import Screen
from gpusched.client import textcells

NOW = 1_800_000_000.0
STATES = ["pending", "running", "succeeded", "failed", "cancelled", "timeout", "oom", "lost"]


class Stream(io.StringIO):
    """A standard output that is a terminal, or not."""

    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


# What a terminal or a pipe may have in its environment; the rest is removed.
ENVIRONMENTS = st.fixed_dictionaries(
    {},
    optional={
        "COLUMNS": st.sampled_from(["20", "45", "80", "132", "250", "x"]),
        "LINES": st.sampled_from(["24", "5"]),
        "NO_COLOR": st.sampled_from(["1", ""]),
        "FORCE_COLOR": st.sampled_from(["1", ""]),
        "TERM": st.sampled_from(["xterm-256color", "dumb", "unknown"]),
        "TTY_COMPATIBLE": st.sampled_from(["0", "1"]),
    },
)
# Text from elsewhere: names, commands, reasons; wide characters, escapes and markup too.
TEXT = st.one_of(
    st.text(max_size=12),
    st.text(alphabet="ab [/]:x-_.漢字é\t\x1b", max_size=30),
    st.sampled_from(["", "train", "sweep-3", "[red]x[/]", ":smile:", "漢字漢字"]),
)


def drawn(draw_with, tty: bool, environ: dict) -> str:
    """What draw_with(screen) prints through a Screen on a terminal or a pipe."""
    stream = Stream(tty)
    draw_with(Screen(environ, stream))
    return stream.getvalue()


# The only escape sequences a Screen sends itself: its styles' SGR codes.
SGR_CODE = re.compile(r"\x1b\[[0-9;]*m")


@st.composite
def jobs(draw) -> dict:
    state = draw(st.sampled_from(STATES))
    started = None if state == "pending" else NOW - draw(st.integers(0, 10**6))
    array = draw(st.sampled_from([None, None, 7]))
    return {
        "id": draw(st.integers(1, 10**6)),
        "user": draw(TEXT),
        "name": draw(TEXT),
        "uid": 0,
        "state": state,
        "cancelling": draw(st.booleans()),
        "submitted_at": NOW - 10**6,
        "started_at": started,
        "ended_at": None if state in ("pending", "running") else NOW,
        "pending_reason": draw(TEXT),
        "end_reason": draw(TEXT),
        "shim_lost": draw(st.booleans()),
        "command": draw(st.lists(TEXT, min_size=1, max_size=3)),
        "gpus_requested": draw(st.integers(0, 8)),
        "gpu_mem_bytes": draw(st.sampled_from([None, 20 * 2**30])),
        "gpu_indices": draw(st.lists(st.integers(0, 15), max_size=3)),
        "cpus": draw(st.integers(0, 64)),
        "mem_bytes": draw(st.sampled_from([None, 2**34])),
        "mem_peak_bytes": draw(st.sampled_from([None, 0, 2**33])),
        "mem_over": draw(st.booleans()),
        "exit_code": draw(st.sampled_from([None, 0, 2])),
        "signal": draw(st.sampled_from([None, 0, 15])),
        "progress": draw(
            st.sampled_from([None, {"fraction": 0.42, "message": "x", "updated_at": NOW}])
        ),
        "array_id": array,
        "array_index": draw(st.integers(0, 9)) if array else None,
        "array_throttle": draw(st.sampled_from([None, 2])) if array else None,
    }


@settings(max_examples=150, deadline=None)
@given(
    job_list=st.lists(jobs(), max_size=5),
    expand=st.booleans(),
    filtered=st.booleans(),
    finished=st.booleans(),
    tty=st.booleans(),
    environ=ENVIRONMENTS,
)
def test_ls_sends_no_escape_of_its_own_text(job_list, expand, filtered, finished, tty, environ):
    printed = drawn(
        lambda out: jobviews.draw_jobs(out, job_list, expand, filtered, finished), tty, environ
    )
    assert "\x1b" not in SGR_CODE.sub("", printed)
    assert printed.endswith("\n")


def test_ls_on_a_terminal_in_colour():
    job = {
        "id": 3,
        "user": "ada",
        "name": "train",
        "state": "running",
        "cancelling": False,
        "submitted_at": NOW - 60,
        "started_at": NOW - 30,
        "ended_at": None,
        "pending_reason": "",
        "end_reason": "",
        "command": ["python", "train.py"],
        "gpus_requested": 1,
        "gpu_mem_bytes": None,
        "gpu_indices": [0],
        "cpus": 1,
        "mem_bytes": 2**34,
        "mem_peak_bytes": 2**35,
        "mem_over": True,
        "exit_code": None,
        "signal": None,
        "array_id": None,
    }
    for environ, expected in (({}, "\x1b[32mrunning\x1b[0m"), ({"NO_COLOR": "1"}, "  running  ")):
        environ = {"COLUMNS": "200", "TERM": "xterm-256color", **environ}
        plain = drawn(lambda out: jobviews.draw_jobs(out, [job], True, False, False), True, environ)
        assert plain.startswith("\x1b[1mID\x1b[0m") and expected in plain


@st.composite
def gpu_readings(draw) -> dict:
    gpus = []
    for index in range(draw(st.integers(0, 3))):
        processes = [
            {
                "pid": draw(st.integers(1, 10**6)),
                "visible": draw(st.booleans()),
                "job": draw(st.sampled_from([None, 3])),
                "user": draw(st.one_of(st.none(), TEXT)),
                "used_mem_bytes": 2**30,
                "command": draw(st.one_of(st.none(), TEXT)),
            }
            for _ in range(draw(st.integers(0, 2)))
        ]
        gpus.append(
            {
                "label": draw(st.sampled_from([str(index), f"{index}/1", "[b]", "a:b:"])),
                "name": draw(TEXT),
                "mem_used_bytes": draw(st.integers(0, 2**37)),
                "mem_reserved_bytes": 2**34,
                "mem_total_bytes": 80 * 2**30,
                "util_pct": draw(st.sampled_from([None, 0.0, 99.6])),
                "healthy": draw(st.booleans()),
                "health_reason": draw(st.one_of(st.none(), TEXT)),
                "jobs": draw(st.lists(st.integers(1, 999), max_size=3)),
                "processes": processes,
            }
        )
    host = {
        "cpus": 16,
        "cpus_reserved": draw(st.integers(0, 20)),
        "cpu_used_pct": 12.5,
        "mem_bytes": 2**36,
        "mem_reserved_bytes": 2**33,
        "mem_used_bytes": 2**32,
    }
    return {"gpus": gpus, "host": host, "problem": draw(st.sampled_from(["", "no NVML"]))}


@settings(max_examples=150, deadline=None)
@given(result=gpu_readings(), tty=st.booleans(), environ=ENVIRONMENTS)
def test_gpus_sends_no_escape_of_its_own_text(result, tty, environ):
    printed = drawn(lambda out: jobviews.draw_gpus(out, result), tty, environ)
    assert "\x1b" not in SGR_CODE.sub("", printed)
    assert "host: " in printed


def test_gpus_tables_on_a_terminal():
    gpu = {
        "label": "0",
        "name": "NVIDIA [b]H100[/b] :smile:",
        "mem_used_bytes": 2**30,
        "mem_reserved_bytes": 2**34,
        "mem_total_bytes": 80 * 2**30,
        "util_pct": 99.6,
        "healthy": False,
        "health_reason": "fell off the bus",
        "jobs": [3, 4],
        "processes": [
            {
                "pid": 42,
                "visible": True,
                "job": 3,
                "user": "ada",
                "used_mem_bytes": 2**30,
                "command": "python train.py",
            }
        ],
    }
    host = {
        "cpus": 16,
        "cpus_reserved": 2,
        "cpu_used_pct": 12.5,
        "mem_bytes": 2**36,
        "mem_reserved_bytes": 2**33,
        "mem_used_bytes": 2**32,
    }
    printed = drawn(
        lambda out: jobviews.draw_gpus(out, {"gpus": [gpu], "host": host, "problem": ""}),
        True,
        {"COLUMNS": "200", "TERM": "xterm-256color"},
    )
    lines = SGR_CODE.sub("", printed).splitlines()
    assert lines[0].split() == ["GPU", "NAME", "MEMORY", "USED", "/", "RESERVED", "/"] + [
        "TOTAL",
        "UTIL",
        "HEALTH",
        "JOBS",
    ]
    # Text from elsewhere is never read as markup or emoji codes.
    assert lines[1].startswith("0    NVIDIA [b]H100[/b] :smile:  1.0 GiB / 16.0 GiB / 80.0 GiB")
    assert "\x1b[31mfell off the bus\x1b[0m" in printed
    assert lines[3] == ""
    assert lines[4].split() == ["GPU", "PID", "USER", "JOB", "GPU", "MEM", "COMMAND"]
    assert lines[5].split() == ["0", "42", "ada", "3", "1.0", "GiB", "python", "train.py"]
    # Narrower than the table: each row stays whole (the terminal wraps it), never
    # shrunk into folded cells, on the typer path as on the fast path.
    narrow = drawn(
        lambda out: jobviews.draw_gpus(out, {"gpus": [gpu], "host": host, "problem": ""}),
        True,
        {"COLUMNS": "40", "TERM": "xterm-256color"},
    )
    assert SGR_CODE.sub("", narrow).splitlines()[:2] == lines[:2]


@settings(max_examples=300, deadline=None)
@given(text=st.text(), width=st.integers(0, 40))
def test_cell_widths_are_richs(text, width):
    assert textcells.text_width(textcells.printable(text)) == cell_len(textcells.printable(text))
    assert textcells.set_cell_size(text, width) == set_cell_size(text, width)


def test_ls_at_80_columns_shows_a_size_whole_or_not_at_all():
    """Once, MEM's values made an 80-column ls 91 wide, and REQUEST read `1x30.0…`."""
    base = {
        "user": "ada",
        "state": "running",
        "cancelling": False,
        "submitted_at": NOW - 60,
        "started_at": NOW - 30,
        "ended_at": None,
        "pending_reason": "",
        "end_reason": "",
        "gpus_requested": 1,
        "gpu_mem_bytes": 30 * 2**30,
        "cpus": 1,
        "mem_bytes": 2**30,
        "mem_over": False,
        "exit_code": None,
        "signal": None,
        "array_id": None,
    }
    jobs = [
        {
            **base,
            "id": 4 + n,
            "name": name,
            "command": ["python3", "-c", "x" * 60],
            "gpu_indices": [n],
            "mem_peak_bytes": int(60.9 * 2**20),
        }
        for n, name in enumerate(["a", "train-long-name"])
    ]
    for width in range(40, 121):
        lines = [
            "".join(text for text, _ in line)
            for line in lsview.ls_lines(jobs, width=width, now=NOW)
        ]
        assert all(len(line) <= width for line in lines), (width, lines)
        for line in lines[1:]:
            assert "1x30.0 GiB" in line or "1x30" not in line, (width, line)
            assert "60.9 MiB/1.0 GiB" in line or "60.9" not in line, (width, line)
