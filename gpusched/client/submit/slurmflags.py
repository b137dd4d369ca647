"""sbatch's options that gpusched reads but cannot honour, and stray words before `--`.

Both submit parsers (the fast path and typer's) check the command line here first, so a
Slurm user's `-p gpu` or `-d afterok:68 69 70 -- true` is refused in one line (exit 2),
never silently dropped nor run as part of the command. Standard library only: the submit
fast path imports it.
"""

from __future__ import annotations

from gpusched.core.errors import UsageError

# sbatch's options that have no meaning on one machine, or that gpusched does not do:
# (flags, takes a value, why and what to use instead). Slurm's meanings of the short
# letters, so that none of them is ever read as something else.
REFUSED = (
    (
        ("-p", "--partition"),
        True,
        "gpusched has no partitions: this machine's GPUs form one queue. Leave it out",
    ),
    (
        ("-w", "--nodelist"),
        True,
        "gpusched runs jobs on this machine only. Choose GPUs with --gpu-ids",
    ),
    (
        ("-x", "--exclude"),
        True,
        "gpusched runs jobs on this machine only. Keep GPUs out with --exclude-gpus",
    ),
    (("-q", "--qos"), True, "gpusched has no QOS. Use --priority"),
    (("-A", "--account"), True, "gpusched has no accounts: usage counts by user. Leave it out"),
    (
        ("-C", "--constraint"),
        True,
        "gpusched has no node features. Use --gpu-type, "
        "--min-gpu-total-mem or --min-compute-capability",
    ),
    (("-i", "--input"), True, "a job's standard input is /dev/null. Read the file from the job"),
    (("-m", "--distribution"), True, "a job is one task on one machine. Leave it out"),
    (("-F", "--nodefile"), True, "gpusched runs jobs on this machine only. Leave it out"),
    (("-L", "--licenses"), True, "gpusched has no licenses. Leave it out"),
    (("-S", "--core-spec"), True, "cores are not reserved for the system. Leave it out"),
    (("-B", "--extra-node-info"), True, "gpusched runs jobs on this machine only. Leave it out"),
    (
        ("--requeue",),
        False,
        "a job runs at most once unless asked. Give --retries N --retry-on lost,failed",
    ),
    (("-k", "--no-kill"), False, "a job runs on this machine only. Leave it out"),
    (("-s", "--oversubscribe"), False, "GPUs are shared by memory. Give --gpu-mem"),
    (("-O", "--overcommit"), False, "a job is one task. Leave it out"),
    (
        ("--parsable",),
        False,
        "submit prints the job's id alone already, as sbatch --parsable does. Leave it out",
    ),
)
# flag -> (its long name, takes a value, why).
_REFUSED_FLAGS = {
    flag: (flags[-1], takes_value, why) for flags, takes_value, why in REFUSED for flag in flags
}


def check_command_line(argv: list[str], options: dict[str, tuple[str, str]]) -> None:
    """Refuse an sbatch option gpusched cannot honour, and words before a `--` that are
    neither options nor their values (the command goes after `--`). `options`: each
    submit flag -> (field, kind), to know which take a value. Anything else unknown is
    left to the parser, which names it."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return
        if not arg.startswith("-") or arg == "-":
            _refuse_stray_words(argv[i:], argv[max(i - 2, 0) : i])
            return
        name, has_inline = (
            (arg.partition("=")[0], "=" in arg) if arg.startswith("--") else (arg[:2], len(arg) > 2)
        )
        if name in _REFUSED_FLAGS:
            _refuse(arg, name)
        if arg not in options and name not in options:
            return  # a typo, --help, or -WG: the parser reads it and the rest
        kind = options.get(name, options.get(arg, ("", "")))[1]
        takes_value = kind not in ("flag", "yesno")
        i += 2 if takes_value and not has_inline else 1


def _refuse(arg: str, name: str) -> None:
    long_name, _, why = _REFUSED_FLAGS[name]
    shown = name if name == long_name else f"{name} (Slurm's {long_name})"
    raise UsageError(f"{shown} is not supported: {why}")


_SIZE_OPTIONS = ("--gpu-mem", "--mem", "--min-gpu-total-mem")


def _refuse_stray_words(rest: list[str], before: list[str]) -> None:
    """`submit -d afterok:68 69 70 -- true` must not run `69 70 -- true`. `before`: the
    option and value just before the stray words, for a hint that fits them."""
    if "--" not in rest:
        return
    stray = rest[: rest.index("--")]
    option = before[0].partition("=")[0] if len(before) == 2 else ""
    if option in _SIZE_OPTIONS:
        hint = f"a size and its unit go together: {option} {before[1]}{stray[0]}"
    elif option in ("-d", "--dependency", "--after"):
        hint = "ids go together: -d afterok:68:69:70"
    else:
        hint = "quote a value that holds spaces"
    raise UsageError(
        f"{' '.join(stray)!r} before `--` is neither an option nor its value. "
        f"Put options before `--` and the whole command after it ({hint})"
    )


def check_one_node(ntasks: int | None, nodes: str | None) -> None:
    """Slurm's --ntasks and --nodes, which gpusched honours only as 1."""
    if ntasks is not None and ntasks != 1:
        raise UsageError(
            f"--ntasks {ntasks}: a gpusched job is one task. Start more from "
            "the job (torchrun, mpirun), or give --array for independent ones"
        )
    if nodes is not None and nodes.strip() not in ("1", "1-1"):
        raise UsageError(
            f"--nodes {nodes}: gpusched runs each job on this one machine. Give 1 or leave it out"
        )


def gres_as_gpus(text: str) -> str:
    """Slurm's --gres gpu[:TYPE]:N as --gpus [TYPE:]N: 'gpu' -> '1', 'gpu:a100:2' -> 'a100:2'."""
    name, _, rest = text.strip().partition(":")
    if name != "gpu" or "," in rest:
        raise UsageError(
            f"--gres {text!r}: only GPUs can be asked for, as gpu[:TYPE]:N (gpu:2, gpu:a100:2)"
        )
    return rest or "1"


def exported_environment(env: dict[str, str], text: str) -> dict[str, str]:
    """Slurm's --export: ALL (all of env), NONE (nothing), or NAME[=VALUE] items: only
    those, on top of all of env when ALL is one of them. A bare NAME takes env's value."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise UsageError("--export wants ALL, NONE or NAME[=VALUE] items, not an empty value")
    keep_all = any(item.upper() == "ALL" for item in items)
    out = dict(env) if keep_all else {}
    for item in items:
        if item.upper() in ("ALL", "NONE"):
            continue
        name, has_value, value = item.partition("=")
        if not name:
            raise UsageError(f"--export {text!r}: {item!r} has no NAME; give NAME or NAME=VALUE")
        if has_value:
            out[name] = value
        elif name in env:
            out[name] = env[name]
    return out
