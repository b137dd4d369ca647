"""The one lookup of a job's program, in both modes: as execvp(3) and shells find it."""

from __future__ import annotations

import os

import pytest

from conftest import executable
from gpusched.proc import jobexec


def test_names_with_a_slash_are_used_as_they_are():
    assert jobexec.find_program("./run.sh", {"PATH": "/nowhere"}) == "./run.sh"
    assert jobexec.find_program("bin/run", {}) == "bin/run"


def test_path_entries_in_order_skipping_what_cannot_run(tmp_path):
    executable(tmp_path / "a" / "tool", "#!/bin/sh\n", mode=0o644)  # not executable
    (tmp_path / "b" / "tool").mkdir(parents=True)  # a directory
    found = executable(tmp_path / "c" / "tool", "#!/bin/sh\n")
    executable(tmp_path / "d" / "tool", "#!/bin/sh\n")
    path = os.pathsep.join(str(tmp_path / d) for d in "abcd")
    assert jobexec.find_program("tool", {"PATH": path}) == str(found)


def test_an_empty_path_entry_is_the_working_directory(tmp_path, monkeypatch):
    executable(tmp_path / "tool", "#!/bin/sh\n")
    monkeypatch.chdir(tmp_path)
    assert jobexec.find_program("tool", {"PATH": "/nowhere::/usr/bin"}) == "./tool"
    with pytest.raises(jobexec.StartError):
        jobexec.find_program("tool", {"PATH": "/nowhere:/usr/bin"})


def test_without_path_the_default_one_is_searched():
    assert jobexec.find_program("sh", {}) in {f"{d}/sh" for d in os.defpath.split(os.pathsep)}


def test_a_command_found_but_not_executable_is_said_so(tmp_path):
    executable(tmp_path / "tool", "#!/bin/sh\n", mode=0o644)
    with pytest.raises(jobexec.StartError) as caught:
        jobexec.find_program("tool", {"PATH": f"/nowhere:{tmp_path}"})
    assert str(caught.value) == f"{tmp_path}/tool is not executable (permission denied)"


def test_an_output_is_opened_without_waiting_and_only_a_file_or_a_device(tmp_path):
    """A FIFO, read or not, would let a job block (unstoppable, before its exec) in its
    open() or its writes: refused at once. A file and /dev/null open, left blocking."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(jobexec.StartError, match="is a FIFO"):  # nobody reads it
        jobexec.open_output(str(fifo), os.O_APPEND, 0o600)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(jobexec.StartError, match="is a FIFO"):  # a reader, still refused
            jobexec.open_output(str(fifo), os.O_APPEND, 0o600)
    finally:
        os.close(reader)
    for path in (str(tmp_path / "job.out"), os.devnull):
        fd = jobexec.open_output(path, os.O_CREAT | os.O_APPEND, 0o600)
        try:
            assert os.get_blocking(fd)
            os.write(fd, b"x")
        finally:
            os.close(fd)
    assert (tmp_path / "job.out").read_text() == "x"
