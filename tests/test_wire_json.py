"""client/wire.py reads and writes JSON through json's C accelerator without importing json
(issue 15): it must give exactly what json.dumps / json.loads give, values and errors, for
every message, and the same again on a Python without the accelerator."""

from __future__ import annotations

import json
import math
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.client import wire
from gpusched.client.textcells import shell_quote

TEXT = st.text(st.characters(codec="utf-8") | st.sampled_from('"\\\n\t\x00\x7f\u2028é€😀'))
SCALARS = (
    st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70) | st.floats() | TEXT
)
MESSAGES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5),
    max_leaves=30,
)


def same(a: object, b: object) -> bool:
    """Equal, with the same types all the way down, NaN equal to NaN and -0.0 not 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return repr(a) == repr(b)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


def outcome(call, *args):
    """A call's value, or its error as (type, message)."""
    try:
        return call(*args)
    except Exception as exc:
        return (type(exc), str(exc))


@settings(max_examples=300, deadline=None)
@given(message=MESSAGES, allow_nan=st.booleans())
def test_dumps_writes_what_json_writes(message, allow_nan):
    ours = outcome(wire.dumps, message, allow_nan)
    theirs = outcome(
        lambda m, a: json.dumps(m, separators=(",", ":"), allow_nan=a), message, allow_nan
    )
    assert ours == theirs


@settings(max_examples=300, deadline=None)
@given(message=MESSAGES, spaces=st.sampled_from(["", " ", "\n\t ", "\r\n"]))
def test_loads_reads_what_json_reads(message, spaces):
    text = spaces + json.dumps(message, ensure_ascii=False) + spaces
    for body in (text, text.encode("utf-8", "surrogatepass"), json.dumps(message).encode()):
        assert same(wire.loads(body), json.loads(body))


@settings(max_examples=300, deadline=None)
@given(
    body=st.binary(max_size=40)
    | st.text(max_size=40).map(str.encode)
    | st.sampled_from(
        [
            b"",
            b"{",
            b'{"a":1} x',
            b"\xef\xbb\xbf{}",
            b'{"a":NaN}',
            b"[1,]",
            '{"a":1}'.encode("utf-16"),
            b'"\\ud800"',
            b"1" * 5000,
            b"{} {}",
            b"\x00{}",
            b"[-Infinity, Infinity]",
            b'{"a" : [1 , 2.5e3 ] }',
        ]
    )
)
def test_loads_refuses_what_json_refuses_in_its_words(body):
    ours, theirs = outcome(wire.loads, body), outcome(json.loads, body)
    assert same(ours, theirs) if not isinstance(theirs, tuple) else ours == theirs


@settings(max_examples=300, deadline=None)
@given(message=MESSAGES)
def test_the_daemons_reading_is_jsons_where_no_key_is_given_twice(message):
    text = json.dumps(message)
    for body in (text.encode(), b"\xef\xbb\xbf" + text.encode()):  # the C road, and json's
        ours, theirs = outcome(wire.loads, body, True), outcome(json.loads, body)
        assert same(ours, theirs) if not isinstance(theirs, tuple) else ours == theirs


@pytest.mark.parametrize("accelerated", [True, False])
def test_the_daemons_reading_refuses_a_key_given_twice_at_any_depth(monkeypatch, accelerated):
    """json keeps the last value of a key given twice: {"cmd":"ping","cmd":"stop"} stopped
    the daemon (issue 32)."""
    from gpusched.core.errors import ProtocolError

    if not accelerated:
        monkeypatch.setattr(wire, "_scan_unique", None)
    for body, key in (
        (b'{"cmd":"ping","cmd":"stop"}', "'cmd'"),
        (b'{"a":[{"b":{"c":1,"d":2,"c":3}}]}', "'c'"),
        (b'\xef\xbb\xbf{"x":1,"x":1}', "'x'"),
    ):  # a BOM: json's own road
        with pytest.raises(ProtocolError, match=f"the request gives the key {key} twice"):
            wire.loads(body, unique_keys=True)
        assert isinstance(wire.loads(body), dict)  # a client's reading of a reply: json's


def test_without_the_accelerator_json_does_it_all(monkeypatch):
    monkeypatch.setattr(wire, "_json", None)
    monkeypatch.setattr(wire, "_scan_once", None)
    message = {"cmd": "list", "args": {"users": ["é", "😀"], "last": 2**70, "f": 1.5}}
    assert wire.dumps(message) == json.dumps(message, separators=(",", ":"))
    assert wire.loads(wire.encode(message)[wire.HEADER_BYTES :]) == message
    with pytest.raises(ValueError):
        wire.dumps({"x": math.nan}, allow_nan=False)


def test_a_request_with_nan_is_refused_before_sending():
    from gpusched.core.errors import ProtocolError

    with pytest.raises(ProtocolError, match="cannot carry NaN"):
        wire.encode({"cmd": "wait", "args": {"timeout_s": math.inf}}, allow_nan=False)
    assert wire.encode({"x": math.nan}) == b'\x00\x00\x00\x09{"x":NaN}'  # a reply may carry NaN


@given(st.text(st.sampled_from("ab_@%+=:,./-'\" \t\né$`!*")))
def test_shell_quote_is_shlex_quote(word):
    assert shell_quote(word) == shlex.quote(word)
