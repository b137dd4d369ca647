"""Slurm's syntax: job ids and `submit`'s options (stdlib only: the submit fast path imports it).

Read with str methods, not re, and with signal's C half: every command imports this
module, and re or signal (which imports enum) would cost each about 4 ms.
"""

from __future__ import annotations

from gpusched.core.errors import UsageError
from gpusched.core.spec.values import shown
from gpusched.core.units import duration_parts, number_end, parse_duration, parse_size

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from collections.abc import Sequence

# The most that limits.jobs may allow: an --array past it is refused before its indices
# are listed; the configured limits.jobs (100,000 by default) refuses at submit.
MAX_ARRAY_SIZE = 1_000_000
# As Slurm's indices stay below its MaxArraySize: an index is a position in a sweep, and
# one of 2**40 only ever came from a typo (or a request written by hand).
MAX_ARRAY_INDEX = MAX_ARRAY_SIZE - 1
# The largest id the daemon gives or takes: a pending job's place in line packs its id
# into 48 bits beside its priority (core/sched/pendingqueue.py). 2**48 ids last 8,900 years
# at 1,000 jobs a second.
MAX_JOB_ID = 2**48 - 1
MAX_PRIORITY = 10**6
MAX_DURATION_S = 100 * 365 * 86400.0  # a time limit or retry delay: a century at most
# "after" is met once the job has started (or ended without starting), as in Slurm;
# "aftercorr" once the element of the same index of another array has succeeded.
DEPENDENCY_KINDS = ("afterok", "afterany", "afternotok", "after", "aftercorr")
# Entries with no job, stored with id 0 (no job has it): Slurm's singleton (one job of a
# user and name at a time), and ANY_OF, first in a job's dependencies when any one of
# them is enough (Slurm's `?` separator; `,` means all of them).
SINGLETON, ANY_OF = "singleton", "?"
RETRY_ON_CHOICES = ("failed", "timeout", "oom", "cancelled", "lost", "gpu_oom")
# Warning signals go through the job's shim, which passes on only these (spawn.FORWARDED);
# any other would stay with the shim (ALRM is its SIGKILL timer; KILL or STOP stop it).
WARN_SIGNAL_NAMES = ("USR1", "USR2", "INT", "HUP", "QUIT", "TERM")
JOB_ID_FORMS = "an ID like 12, or ARRAY_INDEX like 12_3 for one element of array 12"
# Slurm's --time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S; and gpusched's own 45s, 2h30m, 1d.
TIME_FORMS = (
    "minutes (90), M:S, H:M:S, D-H, D-H:M or D-H:M:S as in Slurm, or units "
    "(45s, 2h30m, 1d); 0 or UNLIMITED for no limit"
)
NO_TIME_LIMIT = ("0", "UNLIMITED", "INFINITE")


def is_digits(text: str) -> bool:
    """Whether text is one or more of 0-9 (str.isdigit alone takes other scripts' digits)."""
    return text.isascii() and text.isdigit()


def is_bare_number(text: str) -> bool:
    """12 or 1.5: digits 0-9, with a fraction or not."""
    return text != "" and number_end(text, ascii_only=True) == len(text)


def parse_job_id(text: object) -> tuple[int, int | None]:
    """'12' -> (12, None); '12_3' -> (12, 3): a job (or whole array), or one array element.

    Anything else is refused, never read as something nearby: '12_' (what a script's
    `cancel ${ARRAY}_${INDEX}` sends when INDEX is empty) must not name the whole array,
    and '4_7' must not be 47, as Python's int() would read it.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if 0 <= text <= MAX_JOB_ID:
            return text, None  # a number from an older client
        text = str(text)  # named as the text it would be (JSON has no int str() refuses)
    base_text, underscore, index_text = text.partition("_") if isinstance(text, str) else ("",) * 3
    if is_digits(base_text) and (is_digits(index_text) or not underscore):
        base, index = _id_number(base_text), _id_number(index_text or "0")
        if base is not None and index is not None:
            return base, index if underscore else None
    raise UsageError(f"{shown(text)} is not a job id; give {JOB_ID_FORMS}")


def _id_number(digits: str) -> int | None:
    """Digits as an id up to MAX_JOB_ID, or None. Counted before int() reads them: it
    refuses more than 4300 digits (ValueError)."""
    digits = digits.lstrip("0") or "0"
    if len(digits) > len(str(MAX_JOB_ID)) or int(digits) > MAX_JOB_ID:
        return None
    return int(digits)


def job_id_text(text: object) -> str:
    """A checked job id in its plain form ('012_3' -> '12_3'), as the CLI sends it."""
    base, index = parse_job_id(text)
    return str(base) if index is None else f"{base}_{index}"


def parse_array(text: str) -> tuple[tuple[int, ...], int | None]:
    """'0-99%8', '1,3,5-7', '0-15:4' -> (indices, at-most-at-once)."""
    spec, _, throttle_text = text.partition("%")
    indices: list[int] = []
    for part in spec.split(","):
        bounds = _array_range(part.strip())
        if bounds is None:
            raise UsageError(f"--array wants ranges like 0-99, 1,3,5-7 or 0-99%8, not {text!r}")
        first, last, step = bounds
        if step < 1:
            raise UsageError(f"--array range {part!r}: the step after ':' must be 1 or more")
        if last < first:
            raise UsageError(f"--array range {part!r} is empty")
        # Count before building: a typo like 0-1000000000 must not fill the memory.
        if len(indices) + (last - first) // step + 1 > MAX_ARRAY_SIZE:
            raise UsageError(f"--array {text!r} has more than {MAX_ARRAY_SIZE} elements")
        if last > MAX_ARRAY_INDEX:
            raise UsageError(f"--array {text!r}: an index is at most {MAX_ARRAY_INDEX:,}")
        indices.extend(range(first, last + 1, step))
    throttle = None
    if throttle_text:
        if not throttle_text.isdigit() or int(throttle_text) < 1:
            raise UsageError(
                f"--array: the part after % must be a positive count, not {throttle_text!r}"
            )
        throttle = int(throttle_text)
    return tuple(sorted(set(indices))), throttle


def _array_range(text: str) -> tuple[int, int, int] | None:
    """'3' -> (3, 3, 1), '0-99' -> (0, 99, 1), '0-15:4' -> (0, 15, 4); None otherwise."""
    first, dash, rest = text.partition("-")
    last, colon, step = rest.partition(":")
    if not (is_digits(first) and (is_digits(last) or not dash) and (is_digits(step) or not colon)):
        return None
    return int(first), int(last) if dash else int(first), int(step) if colon else 1


def parse_dependencies(after: list[str], dependency: list[str]) -> list[tuple[str, int | str]]:
    """--after 3,4 (afterok) and Slurm's --dependency afterok:3:4,afterany:5,after:6, or
    any of them with `?` (afterok:3?afterany:5), and singleton.

    An id is a number, or ARRAY_INDEX text ('12_3') that the daemon turns into the
    element's own job id. With `?`, (ANY_OF, 0) comes first.
    """
    deps: list[tuple[str, int | str]] = []
    for text in after:
        deps += [("afterok", _dependency_id(i, "--after")) for i in text.split(",") if i.strip()]
    any_of = [text for text in dependency if "?" in text]
    if any_of and ("," in any_of[0] or len(after) + len(dependency) > 1):
        # Slurm takes one separator per expression (and reads a mix as all `?`): refused
        # rather than guessed at, as `a,b?c` may mean (a and b) or c.
        raise UsageError(
            f"--dependency {any_of[0]!r} mixes '?' (any of) with ',' or other "
            "dependencies (all of); give one expression with one separator"
        )
    for text in dependency:
        if "+" in text:
            raise UsageError(
                f"--dependency {text!r}: a delay after the start "
                "(after:ID+MINUTES) is not supported; use after:ID"
            )
        for clause in filter(None, (c.strip() for c in text.split("?" if any_of else ","))):
            deps += _dependency_clause(clause)
    return [(ANY_OF, 0), *deps] if any_of and deps else deps


def _dependency_clause(clause: str) -> list[tuple[str, int | str]]:
    """'afterok:3:4' -> [('afterok', 3), ('afterok', 4)]; 'singleton' -> [('singleton', 0)]."""
    kind, *ids = clause.split(":")
    kind = kind.strip().lower()
    if kind == SINGLETON and not ids:
        return [(SINGLETON, 0)]
    if kind not in DEPENDENCY_KINDS or not ids:
        raise UsageError(
            f"--dependency wants KIND:ID[:ID] with KIND one of "
            f"{', '.join(DEPENDENCY_KINDS)}, or singleton, not {clause!r}"
        )
    return [(kind, _dependency_id(i, "--dependency")) for i in ids]


def dependency_words(deps: Sequence[tuple[str, int]]) -> list[str]:
    """A job's dependencies as Slurm writes them, one word per condition that must hold:
    ['afterok:3', 'singleton'], or one word for any of them: ['afterok:3?afterany:5']."""
    words = [kind if kind == SINGLETON else f"{kind}:{dep}" for kind, dep in deps if kind != ANY_OF]
    return ["?".join(words)] if words and deps[0][0] == ANY_OF else words


def dependency_job_ids(deps: Sequence[tuple[str, int]]) -> list[int]:
    """The jobs that dependencies name (singleton and ANY_OF name none)."""
    return [dep for kind, dep in deps if kind not in (SINGLETON, ANY_OF)]


def _dependency_id(text: str, option: str) -> int | str:
    try:
        base, index = parse_job_id(text.strip())
    except UsageError as exc:
        raise UsageError(f"{option}: {exc.message}") from None
    return base if index is None else f"{base}_{index}"


def parse_time_limit(text: str) -> float | None:
    """Slurm's --time -> seconds; None for no limit (0, UNLIMITED or INFINITE, as in Slurm).

    A bare number is minutes, as in Slurm. Unlike Slurm, which rounds up to whole minutes,
    seconds count as given (the limit is enforced to the second).
    """
    raw = text.strip()
    if raw.upper() in NO_TIME_LIMIT:
        return None
    days, _dash, clock_text = raw.rpartition("-") if "-" in raw else (None, "", raw)
    clock_parts = clock_text.split(":")
    if (
        (days is None or is_digits(days))
        and len(clock_parts) <= 3
        and all(map(is_digits, clock_parts))
    ):
        clock = [int(p) for p in clock_parts]
        if days is None:  # M, M:S or H:M:S
            hours, minutes, seconds = clock if len(clock) == 3 else [0, *clock, 0][:3]
        else:  # D-H, D-H:M or D-H:M:S
            hours, minutes, seconds = (clock + [0, 0])[:3]
        total: float = int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds
    elif duration_parts(raw.lower(), ascii_only=True):
        total = parse_duration(raw)
    else:
        raise UsageError(f"--time {text!r} is not a time limit; use {TIME_FORMS}")
    if total == 0:
        return None
    if total < 1:
        raise UsageError(f"--time {text!r} is under the shortest limit, 1 s")
    if total > MAX_DURATION_S:
        raise UsageError(
            f"--time {text!r} is over the longest limit, 100 years; give a "
            "shorter one, or 0 or UNLIMITED for none"
        )
    return float(total)


def parse_gpus(text: str) -> tuple[int, str]:
    """Slurm's --gpus [TYPE:]N: '2' -> (2, ''); 'a100:2' -> (2, 'a100'), 2 GPUs whose name
    contains a100 (as --gpu-type a100)."""
    gpu_type, colon, count = text.strip().rpartition(":")
    if (
        is_digits(count)
        and not (colon and not gpu_type)
        and not any(c in ":," or c.isspace() for c in gpu_type)
    ):
        return int(count), gpu_type
    if text.strip().startswith("-") and is_digits(text.strip()[1:]):
        raise UsageError(f"--gpus must be 0 or more, not {text}")
    if "," in text:
        raise UsageError(f"--gpus {text!r} names several GPU types; a job takes one: TYPE:N")
    raise UsageError(f"--gpus wants N or TYPE:N like 2 or a100:2, not {text!r}")


def parse_mem(text: str) -> int:
    """Slurm's --mem -> bytes: a bare number is MiB, as in Slurm; else a size (16G, 512M)."""
    raw = text.strip()
    try:
        mem_bytes = parse_size(f"{raw}M" if is_bare_number(raw) else raw)
    except ValueError:
        raise UsageError(
            f"--mem wants a size like 16G or 512M (a bare number is MiB, as in Slurm), not {text!r}"
        ) from None
    if mem_bytes == 0:
        raise UsageError(
            f"--mem {text}: Slurm's 0 (all of a node's memory) is not supported; "
            "give a size like 16G"
        )
    return mem_bytes


def parse_yes_no(text: str, option: str) -> bool:
    """Slurm's yes|no option values (--kill-on-invalid-dep=yes)."""
    value = text.strip().lower()
    if value not in ("yes", "no"):
        raise UsageError(f"{option} takes yes or no, not {text!r}")
    return value == "yes"


def parse_signal_spec(text: str) -> tuple[int, float]:
    """Slurm's --signal [{R|B}:]SIG[@SECONDS]: 'USR1@120', 'B:SIGUSR2@60', '10@30', 'USR1'
    (60 s before, as in Slurm) -> (signal, seconds)."""
    name, _, before = text.partition("@")
    name = name.strip().upper()
    # Slurm's R: (reservations) has no meaning here; B: (the main process only) is read by
    # signal_is_batch_only.
    prefix, colon, rest = name.partition(":")
    if colon and prefix in ("R", "B", "RB", "BR"):
        name = rest
    names = ", ".join(WARN_SIGNAL_NAMES)
    bad = ValueError(
        f"--signal wants [B:]SIGNAL[@SECONDS] like USR1@120 with SIGNAL one of "
        f"{names}, not {text!r}"
    )
    if before and not is_bare_number(before.strip()):
        raise bad
    # signal: 6 ms (its enums), and this module is on every command's path: only for --signal
    import signal  # noqa: PLC0415

    try:
        signum = (
            int(name)
            if is_digits(name)
            else int(signal.Signals[name if name.startswith("SIG") else f"SIG{name}"])
        )
    except KeyError:
        raise bad from None
    if signum not in warn_signals():
        raise bad
    return signum, float(before) if before else 60.0


def signal_is_batch_only(text: str) -> bool:
    """Whether --signal names Slurm's B: (the job's main process only, as Slurm signals only
    the batch shell); without it the signal goes to the main process's children, Slurm's
    steps (see proc/jobtree.py's deliver_warning)."""
    prefix, colon, _ = text.strip().upper().partition(":")
    return bool(colon) and "B" in prefix and set(prefix) <= {"R", "B"}


def warn_signals() -> tuple[int, ...]:
    """The numbers of WARN_SIGNAL_NAMES."""
    import signal  # noqa: PLC0415 - as in parse_signal_spec

    return tuple(int(signal.Signals[f"SIG{name}"]) for name in WARN_SIGNAL_NAMES)


def signal_name(signum: int) -> str:
    """SIGTERM for 15; `signal 99` for a number with no name."""
    import signal  # noqa: PLC0415 - as in parse_signal_spec

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def items(text: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']: a comma-separated option's items."""
    return [part.strip() for part in text.split(",") if part.strip()]
