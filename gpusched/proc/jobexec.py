"""A job's program found on the job's own PATH, as a shell finds it, and why a job could not start.

The shim runs this for every job, in both modes (in system mode after the drop to the
job's user, in the job's working directory), so it is standard library only and its
common path costs one access() per PATH entry tried. Everything that explains a failure
runs only when a job fails to start.
"""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False  # not typing: in the shim's import chain (tests/test_boundaries.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    _Started = TypeVar("_Started")


class StartError(OSError):
    """Why a job could not start, in words for its owner: `show`, its stderr log, `wait`."""


def find_program(name: str, env: dict[str, str]) -> str:
    """The file to run for the command `name`, as execvp(3) and shells find it.

    A name with a slash is used as it is (a relative one from the working directory,
    which the caller has entered). A bare name is looked up in the job's PATH (os.defpath
    without one), skipping files it may not run and directories; an empty entry means the
    working directory, as in shells.
    """
    if "/" in name:
        return name
    path = env.get("PATH", os.defpath)
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    raise StartError(_not_found(name, path))


def _not_found(name: str, path: str) -> str:
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate):  # there, but not for us to run
            return f"{_absolute(candidate)} is not executable (permission denied)"
    return f"no such command {name!r} in PATH ({path})"


def start_program(
    argv: list[str], env: dict[str, str], start: Callable[[str], _Started]
) -> _Started:
    """start(the program for argv[0]), e.g. an exec or a spawn, its failure in words."""
    program = find_program(argv[0], env)
    try:
        return start(program)
    except OSError as exc:
        raise StartError(exec_failure(exc, program)) from None
    except ValueError as exc:  # a name with '=' or a NUL: exec and posix_spawn raise this
        # One job's bad environment fails that job's start, never its supervisor's loop.
        raise StartError(
            f"cannot run {_absolute(program)}: its command or environment "
            f"cannot be passed to a program ({exc})"
        ) from None


def exec_failure(exc: OSError, program: str) -> str:
    """Why the system would not run `program` (an exec's error), in words."""
    shown = _absolute(program)
    code = exc.errno
    if code == errno.ENOENT:
        if not os.path.lexists(program):
            return f"{shown} does not exist"
        interpreter = _interpreter(program)
        if interpreter is None:  # a binary whose loader is missing (another system's?)
            return f"{shown} needs a program loader that this system does not have"
        return f"{shown} names an interpreter that does not exist: {interpreter}"
    if code == errno.EACCES:
        if os.path.isdir(program):
            return f"{shown} is a directory"
        return f"{shown} is not executable (permission denied)"
    if code == errno.ENOEXEC:
        return f"{shown} is not a program this system can run (a script needs a #! line)"
    if code == errno.ENOTDIR:
        return f"{shown}: a part of its path is not a directory"
    if code == errno.E2BIG:
        return "its command line and environment are too long for the system"
    return f"cannot run {shown}: {_plain(exc)}"


def _absolute(program: str) -> str:
    """The program's full path, for the message: the working directory has been entered."""
    try:
        return os.path.abspath(program)
    except OSError:  # the directory was deleted since
        return program


def _interpreter(program: str) -> str | None:
    """What a script's #! line names (None: no #! line, or unreadable)."""
    try:
        with open(program, "rb") as script:
            first = script.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    return first[2:].decode(errors="replace").strip() or "(an empty #! line)"


def enter_cwd(cwd: str) -> None:
    """chdir into the job's working directory, or say in words why it cannot be entered."""
    try:
        os.chdir(cwd)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise StartError(f"working directory {cwd} no longer exists") from None
        if exc.errno == errno.EACCES:
            raise StartError(
                f"working directory {cwd} cannot be entered (permission denied)"
            ) from None
        if exc.errno == errno.ENOTDIR:
            raise StartError(f"working directory {cwd} is not a directory") from None
        raise StartError(f"cannot enter working directory {cwd}: {_plain(exc)}") from None


# What an output may be: a file, or a character device (a terminal, /dev/null). A FIFO
# would hold its open(), and the job, not yet able to take a signal, until a reader came.
_OTHER_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFBLK: "a block device",
}


def open_output(path: str, flags: int, mode: int) -> int:
    """A job's log opened for writing (flags), never waiting: only a regular file or a
    character device is taken, left blocking for the job as a shell would give it;
    anything else is a StartError that says what the path is."""
    try:
        fd = os.open(path, flags | os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ENXIO and _kind_of(path) in _OTHER_KINDS:  # a FIFO unread
            raise StartError(_not_a_log(path, _kind_of(path))) from None
        raise
    kind = stat.S_IFMT(os.fstat(fd).st_mode)
    if kind not in (stat.S_IFREG, stat.S_IFCHR):
        os.close(fd)
        raise StartError(_not_a_log(path, kind))
    os.set_blocking(fd, True)
    return fd


def _kind_of(path: str) -> int:
    try:
        return stat.S_IFMT(os.stat(path).st_mode)
    except OSError:
        return 0


def _not_a_log(path: str, kind: int) -> str:
    what = _OTHER_KINDS.get(kind, "not a regular file")
    return f"output {path} is {what}; give a regular file, a terminal or /dev/null"


def in_words(exc: BaseException) -> str:
    """A start failure for people: the words of a StartError or of the system's error,
    never an exception's name (but for a defect of gpusched's own, which has no other)."""
    if isinstance(exc, OSError):
        if exc.strerror is None:  # a message of ours (StartError, PrivilegeError)
            return str(exc)
        return f"{exc.filename}: {_plain(exc)}" if exc.filename else _plain(exc)
    return f"{type(exc).__name__}: {exc}"


def _plain(exc: OSError) -> str:
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]
