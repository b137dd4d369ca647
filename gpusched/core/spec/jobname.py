"""A job's name when it has no --name: the program it runs, past interpreters and launchers."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from functools import lru_cache

# Programs that run the script (or module, or command string) named after their options.
_INTERPRETER = re.compile(
    r"(python|pypy)(\d+(\.\d+)*)?[a-z]?|bash|sh|zsh|dash|ksh|mksh|"
    r"(perl|ruby|node|nodejs|Rscript|julia|lua|php)(\d+(\.\d+)*)?"
)
_SHELLS = {"bash", "sh", "zsh", "dash", "ksh", "mksh"}
# Options that take the next word as their value.
_PYTHON_VALUED = {"-W", "-X", "-Q"}
_SHELL_VALUED = {"-o", "+o", "-O", "+O"}
_CODE = {"-e", "-E", "--eval", "-p", "--print"}  # perl, ruby, node, Rscript: code, no script

# Programs that run a command given after their options: the options that take the next
# word as their value, the words (a subcommand, a duration...) that come before the
# command, and whether to guess at the other options' values (launchers with many options:
# a value is a word that does not look like a program, as `srun -p gpu` or
# `torchrun --nproc-per-node 2`).
_LAUNCHERS: dict[str, tuple[frozenset[str], int, bool]] = {
    "env": (frozenset({"-u", "--unset", "-C", "--chdir"}), 0, False),
    "nice": (frozenset({"-n", "--adjustment"}), 0, False),
    "nohup": (frozenset(), 0, False),
    "exec": (frozenset(), 0, False),
    "command": (frozenset(), 0, False),
    "catchsegv": (frozenset(), 0, False),
    "time": (frozenset({"-f", "--format", "-o", "--output"}), 0, False),
    "timeout": (frozenset({"-s", "--signal", "-k", "--kill-after"}), 1, False),
    "stdbuf": (frozenset({"-i", "-o", "-e"}), 0, False),
    "ionice": (frozenset({"-c", "--class", "-n", "--classdata"}), 0, False),
    "taskset": (frozenset(), 1, False),
    "chrt": (frozenset(), 1, False),
    "numactl": (frozenset(), 0, True),
    "xvfb-run": (frozenset(), 0, True),
    "srun": (frozenset(), 0, True),
    "mpirun": (frozenset(), 0, True),
    "mpiexec": (frozenset(), 0, True),
    "torchrun": (frozenset(), 0, True),
    "deepspeed": (frozenset(), 0, True),
}
# Tools whose subcommand runs a command: `accelerate launch`, `uv run`, `conda run -n env`.
_SUBCOMMAND = {
    "accelerate": "launch",
    "uv": "run",
    "poetry": "run",
    "pipenv": "run",
    "pdm": "run",
    "hatch": "run",
    "conda": "run",
    "mamba": "run",
    "micromamba": "run",
    "pixi": "run",
}
# `python -m` modules that are launchers themselves.
_LAUNCHER_MODULES = {
    "torch.distributed.run",
    "torch.distributed.launch",
    "accelerate.commands.launch",
    "deepspeed.launcher.runner",
}
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
# A script's extension; any other (a.yaml, ds.json) is an option's value, not a program.
_SCRIPT = re.compile(r"\.(py|pyz|sh|bash|zsh|pl|rb|js|mjs|cjs|ts|[Rr]|jl|lua|php|exe)$")
_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9]*$")


def program_name(command: Sequence[str]) -> str:
    """The name of what a command runs: the script, not its interpreter or launcher.

    `python train.py` -> train.py; `python -m pkg.mod` -> pkg.mod; `torchrun
    --nproc-per-node 2 train.py`, `env A=1 nice uv run python train.py` -> train.py;
    `sh -c 'make all'` -> make; `./run.sh` -> run.sh. An interpreter with no script
    (`python -c ...`) is named itself. "" for an empty command.
    """
    if not command:
        return ""
    base = _base(command[0])
    kind = _kind(base)  # the common cases first: a name is asked for every job listed
    if kind is _PLAIN and "=" not in base:
        return base
    if kind is _RUNS_SCRIPT and len(command) > 1 and command[1][:1] not in "-+":
        return _base(command[1])
    return _name(tuple(command)) or base


@lru_cache(maxsize=4096)
def program_name_of_json(text: str) -> str:
    """program_name of a command stored as JSON text (a row of the queue file); "" if
    it is not a list of strings. Cached: a report reads the same commands again and again."""
    try:
        words = json.loads(text)
    except ValueError:
        return ""
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        return ""
    return program_name(words)


_PLAIN, _LAUNCHER, _TOOL, _RUNS_SCRIPT = "plain", "launcher", "tool", "interpreter"


@lru_cache(maxsize=1024)
def _kind(base: str) -> str:
    if base in _LAUNCHERS:
        return _LAUNCHER
    if base in _SUBCOMMAND:
        return _TOOL
    return _RUNS_SCRIPT if _INTERPRETER.fullmatch(base) else _PLAIN


def _base(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def _looks_like_program(word: str) -> bool:
    base = _base(word)
    return (
        _kind(base) is not _PLAIN
        or bool(_SCRIPT.search(base))
        or ("/" in word and not _EXTENSION.search(base))
    )


def _name(words: tuple[str, ...]) -> str:
    at = 0
    while at < len(words) and _ASSIGNMENT.match(words[at]):
        at += 1  # VAR=value before the program (env's, or a shell's)
    if at == len(words):
        return ""
    base, rest = _base(words[at]), words[at + 1 :]
    kind = _kind(base)
    if kind is _LAUNCHER:
        return _launched(rest, *_LAUNCHERS[base]) or base
    if kind is _TOOL:
        if _SUBCOMMAND[base] not in rest:
            return base
        return _launched(rest[rest.index(_SUBCOMMAND[base]) + 1 :], frozenset(), 0, True) or base
    if kind is _RUNS_SCRIPT:
        return _script(base, rest) or base
    return base


def _launched(words: tuple[str, ...], valued: frozenset[str], positional: int, guess: bool) -> str:
    """The program a launcher runs, given the words after the launcher's name."""
    at, guessed = 0, ""
    while at < len(words) and words[at].startswith("-") and words[at] != "-":
        option = words[at]
        at += 1
        if option == "--":
            break
        if (
            at < len(words)
            and "=" not in option
            and (
                option in valued
                or (guess and not words[at].startswith("-") and not _looks_like_program(words[at]))
            )
        ):
            guessed = words[at]
            at += 1
    at += positional
    if at >= len(words):
        return _base(guessed) if guess and guessed else ""  # `srun --pty tool`: tool
    return _name(words[at:])


def _script(interpreter: str, words: tuple[str, ...]) -> str:
    """What an interpreter runs, given the words after it; "" for code given inline."""
    if words and words[0][:1] not in "-+":
        return _base(words[0])  # `python train.py`: the common case
    shell, python = interpreter in _SHELLS, interpreter.startswith(("python", "pypy"))
    at = 0
    while at < len(words) and words[at][:1] in "-+" and words[at] not in ("-", "--"):
        option = words[at]
        at += 1
        if python and option.startswith("-m"):
            module = option[2:] or (words[at] if at < len(words) else "")
            if module in _LAUNCHER_MODULES:
                return _launched(words[at + (not option[2:]) :], frozenset(), 0, True)
            return module
        if option.startswith("-c") if python else not shell and option in _CODE:
            return ""
        if shell and option.startswith("-") and "c" in option[1:] and option[1:].isalpha():
            return _name(tuple(_split(words[at]))) if at < len(words) else ""
        valued = _PYTHON_VALUED if python else _SHELL_VALUED if shell else set()
        if option in valued:
            at += 1
    at += at < len(words) and words[at] == "--"
    return _base(words[at]) if at < len(words) and words[at] != "-" else ""


# What ends a shell's simple command, and the commands that only set up for the next
# one (`cd /data && python eval.py`): the job is named by the first command that is none.
_CONTROL = frozenset({"|", "||", "|&", "&", "&&", ";", ";;"})
_SETUP = frozenset({"cd", "pushd", "source", ".", "export", "set", "ulimit", "umask", "module"})
_SETUP_TOOLS = {"conda": "activate", "mamba": "activate", "micromamba": "activate"}


def _split(text: str) -> list[str]:
    """The words of the shell command that names a job (`env | sort` -> env; `cd d &&
    python x.py` -> python x.py)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # an unbalanced quote: the words as they stand
        words = text.split()
    commands: list[list[str]] = [[]]
    for word in words:
        if word in _CONTROL:
            commands.append([])
        else:
            commands[-1].append(word)
    named = [c for c in commands if c]
    return next((c for c in named if not _sets_up(c)), named[0] if named else [])


def _sets_up(command: list[str]) -> bool:
    first = _base(command[0])
    return first in _SETUP or command[1:2] == [_SETUP_TOOLS.get(first)]
