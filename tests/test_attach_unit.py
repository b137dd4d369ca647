"""The pure parts of `attach` and `logs --plain`: detach keys as written and as typed, the
frames between attach and a job's terminal, the end line, control sequences left out."""

from __future__ import annotations

import pytest

from gpusched.cli.attach import Session, end_line
from gpusched.cli.logview import PlainText
from gpusched.core.configkeys import detach_key_bytes
from gpusched.proc import ptywire

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("written", "typed"),
    [("ctrl-]", b"\x1d"), ("ctrl-p,ctrl-q", b"\x10\x11"), ("Ctrl-\\", b"\x1c"), ("q", b"q")],
)
def test_detach_keys_are_the_bytes_a_terminal_sends(written, typed):
    assert detach_key_bytes(written) == typed


@pytest.mark.parametrize("written", ["", "ctrl-1", "ctrl-", "alt-x", "ctrl-p,,ctrl-q", 3])
def test_detach_keys_that_are_no_keys_are_refused(written):
    with pytest.raises(ValueError, match="is not a key"):
        detach_key_bytes(written)


class Sent:
    def __init__(self) -> None:
        self.keys = b""

    def sendall(self, data: bytes) -> None:
        frames = ptywire.FrameReader().feed(data)
        assert [kind for kind, _ in frames] == [ptywire.INPUT]
        self.keys += frames[0][1]


def typing(keys: bytes, *chunks: bytes) -> tuple[bytes, bool]:
    """What the job gets of `chunks` typed one read at a time, and whether attach detached."""
    sock = Sent()
    session = Session(1, sock, keys, "")  # type: ignore[arg-type]
    for chunk in chunks:
        if session._type(chunk):
            return sock.keys, True
    return sock.keys, False


def test_the_detach_keys_are_held_back_and_a_near_miss_reaches_the_job():
    assert typing(b"\x1d", b"ab\x1dcd") == (b"ab", True)
    # Docker's two keys, split between two reads, detach; ctrl-p then another key is typed on.
    assert typing(b"\x10\x11", b"x\x10", b"\x11") == (b"x", True)
    assert typing(b"\x10\x11", b"\x10", b"k") == (b"\x10k", False)
    assert typing(b"\x10\x11", b"\x10\x10\x11") == (b"\x10", True)


def test_frames_arrive_whole_however_the_stream_is_cut():
    stream = ptywire.frame(ptywire.OUTPUT, b"hello") + ptywire.frame(ptywire.EXITED, b"{}")
    reader = ptywire.FrameReader()
    frames = [f for i in range(len(stream)) for f in reader.feed(stream[i : i + 1])]
    assert frames == [(ptywire.OUTPUT, b"hello"), (ptywire.EXITED, b"{}")]
    with pytest.raises(ValueError, match="a frame of"):
        ptywire.FrameReader().feed(b"o\xff\xff\xff\xff")


def test_the_end_line_and_status_are_a_shells():
    assert end_line(4, 3, None) == ("[job 4 exited with code 3]", 3)
    assert end_line(4, None, 15) == ("[job 4 was ended by SIGTERM]", 143)


def test_plain_logs_leave_out_control_sequences_even_split_between_reads():
    log = b"\x1b[1;31mred\x1b[0m line\r\n>>> \x1b]0;title\x07x\x1b(B\rbar 1\rbar 2\r\n\ttab\x07\n"
    expect = b"red line\n>>> x\nbar 1\nbar 2\n\ttab\n"
    assert PlainText().feed(log, final=True) == expect
    text = PlainText()
    pieces = [text.feed(log[i : i + 1]) for i in range(len(log))]
    assert b"".join(pieces) + text.feed(b"", final=True) == expect
