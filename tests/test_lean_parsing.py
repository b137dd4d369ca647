"""Job ids, sizes, durations and submit's Slurm options are read with str methods instead
of re (issue 15: re costs every command more than its budget). Each reader must accept and
refuse exactly what its regular expression did: the expressions are kept here as the
reference."""

from __future__ import annotations

import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpusched.core import units
from gpusched.core.errors import UsageError
from gpusched.core.spec import syntax

_JOB_ID_RE = re.compile(r"([0-9]+)(?:_([0-9]+))?")
_RANGE_RE = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")
_SLURM_TIME_RE = re.compile(r"(?:([0-9]+)-)?([0-9]+(?::[0-9]+){0,2})")
_UNIT_TIME_RE = re.compile(
    r"(?:[0-9]+(?:\.[0-9]+)?(?:ms|[dhms]))+"
)  # ms: milliseconds (core/units.py)
_GPUS_RE = re.compile(r"(?:([^:,\s]+):)?([0-9]+)")
_BARE_NUMBER_RE = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|[dhms])")


def words(alphabet: str, max_size: int = 12) -> st.SearchStrategy[str]:
    return st.text(st.sampled_from(alphabet), max_size=max_size)


# Digits of another script (which \d reads and [0-9] does not), spaces of several kinds.
OTHER_DIGITS = "٣०"
SPACES = " \t\n\u00a0\u2003"


def outcome(read, text):
    try:
        return read(text)
    except (UsageError, ValueError) as exc:
        return type(exc), str(exc)


@settings(max_examples=400)
@given(words("0123456789_-x " + OTHER_DIGITS))  # 12 characters: never past MAX_JOB_ID
def test_job_ids(text):
    match = _JOB_ID_RE.fullmatch(text)
    ours = outcome(syntax.parse_job_id, text)
    if match:
        index = match.group(2)
        assert ours == (int(match.group(1)), None if index is None else int(index))
    else:
        assert ours[0] is UsageError


@settings(max_examples=400)
@given(words("0123456789-:,%" + OTHER_DIGITS))
def test_array_ranges(text):
    for part in text.partition("%")[0].split(","):
        match = _RANGE_RE.fullmatch(part.strip())
        ours = syntax._array_range(part.strip())
        if match:
            first = int(match.group(1))
            assert ours == (first, int(match.group(2) or first), int(match.group(3) or 1))
        else:
            assert ours is None
    if not all(_RANGE_RE.fullmatch(p.strip()) for p in text.partition("%")[0].split(",")):
        assert outcome(syntax.parse_array, text)[0] is UsageError


@settings(max_examples=400)
@given(words("0123456789-:.dhmsDH" + SPACES + OTHER_DIGITS))
@example("0ms")  # milliseconds: none at all, as 0 is
def test_time_limits(text):
    raw = text.strip()
    readable = (
        raw.upper() in syntax.NO_TIME_LIMIT
        or _SLURM_TIME_RE.fullmatch(raw)
        or _UNIT_TIME_RE.fullmatch(raw.lower())
    )
    ours = outcome(syntax.parse_time_limit, text)
    assert bool(readable) != (isinstance(ours, tuple) and "is not a time limit" in ours[1])


@settings(max_examples=400)
@given(words("0123456789:,-ab" + SPACES + OTHER_DIGITS))
def test_gpus(text):
    match = _GPUS_RE.fullmatch(text.strip())
    ours = outcome(syntax.parse_gpus, text)
    if match:
        assert ours == (int(match.group(2)), match.group(1) or "")
    else:
        assert ours[0] is UsageError
        assert ("must be 0 or more" in ours[1]) == bool(re.fullmatch(r"-[0-9]+", text.strip()))


@settings(max_examples=400)
@given(words("0123456789.kKmMgGiIbBtT" + SPACES + OTHER_DIGITS))
def test_sizes_and_mem(text):
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else None
    expected = (
        int(float(match.group(1)) * units._SIZE_UNITS[unit])
        if match and unit in units._SIZE_UNITS
        else None
    )
    ours = outcome(units.parse_size, text)
    assert ours == expected if expected is not None else ours[0] is ValueError
    bare = bool(_BARE_NUMBER_RE.fullmatch(text.strip()))
    assert syntax.is_bare_number(text.strip()) == bare


@settings(max_examples=400)
@given(words("0123456789.dhmsx" + SPACES + OTHER_DIGITS))
def test_durations(text):
    raw = text.strip().lower()
    parts = _DURATION_RE.findall(raw)
    scale = {"d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
    theirs = (
        float(sum(float(n) * scale[u] for n, u in parts))
        if parts and "".join(n + u for n, u in parts) == raw
        else None
    )
    try:
        seconds = float(raw)
    except ValueError:
        ours = outcome(units.parse_duration, text)
        assert ours == theirs if theirs is not None else ours[0] is ValueError
        return
    if 0 <= seconds < float("inf"):
        assert units.parse_duration(text) == seconds
