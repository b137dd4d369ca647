"""The options of `submit` and `resubmit`, in one table, and SubmitOptions, which holds them.

The submit fast path's parser, SubmitOptions and the typer commands are all built from
the tables here, so an option is declared once. Plain tuples and classes, no typing or
dataclasses: the fast path imports this module on every submit.
"""

from __future__ import annotations

# typing is imported only by type checkers (it would cost every submit several ms).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

    from typing_extensions import Unpack

    # One option: (SubmitOptions field, flags, kind, default, help).
    OptionRow = tuple[str, tuple[str, ...], str, Any, str]
    # Any table's row that starts as OptionRow does (cli/cmdoptions.py's have more after).
    FlagRow = tuple[str, tuple[str, ...], str, Unpack[tuple[Any, ...]]]

# `submit`'s options, in the order its --help lists them:
# (SubmitOptions field, flags, kind, default, help). The kind says what the value is:
# "str" and "int" take one, "list" takes one each time it is given, "flag" takes none,
# "yesno" is a flag that also takes Slurm's =yes or =no.
SUBMIT: tuple[OptionRow, ...] = (
    (
        "gpus",
        ("--gpus-per-node", "--gpus", "-G"),
        "str",
        None,
        "GPUs to give the job: N, or TYPE:N as in Slurm (a100:2: two whose name contains "
        "a100). Default 0; 1 with --gpu-mem, --gpu-ids or another GPU constraint.",
    ),
    (
        "gpu_mem",
        ("--gpu-mem",),
        "str",
        None,
        "Memory per GPU, e.g. 20G. Jobs may then share a GPU; without it GPUs are whole. auto: "
        "the p95 of earlier successful runs' peaks (same --name or command) plus a margin.",
    ),
    ("name", ("--name", "--job-name", "-J"), "str", "", "A name to show in listings."),
    ("priority", ("--priority",), "int", 0, "Higher starts first."),
    ("cwd", ("--cwd", "--chdir", "-D"), "str", None, "Working directory (default: here)."),
    ("env", ("--env",), "list", [], "Set NAME=VALUE for the job."),
    (
        "from_file",
        ("--from-file", "-f"),
        "str",
        None,
        "One job per line of shell commands (- for stdin), any number of lines; all or nothing.",
    ),
    ("wait", ("--wait", "-W"), "flag", False, "Wait, then exit with the job's status."),
    (
        "notify",
        ("--notify",),
        "flag",
        False,
        "When the job ends, tell this desktop (notify-send) or ring this terminal's bell.",
    ),
    ("json", ("--json",), "flag", False, "Print JSON (stable field names) instead of a table."),
    ("hold", ("--hold", "-H"), "flag", False, "Queue it held: it starts after `release`."),
    (
        "begin",
        ("--begin", "-b"),
        "str",
        None,
        "Start no sooner than this time, as in Slurm: 16:00, now+1hour, tomorrow, midnight, noon, "
        "teatime, 2026-12-24T08:00, 12/24.",
    ),
    (
        "reservation",
        ("--reservation",),
        "str",
        None,
        "Run in this GPU reservation, on its GPUs, inside its window (`gpusched reserve ls`).",
    ),
    ("after", ("--after",), "list", [], "Start after these jobs succeed: 3,4."),
    (
        "dependency",
        ("--dependency", "-d"),
        "list",
        [],
        "Slurm form: afterok:3:4,afterany:5,afternotok:6, after:7 (once 7 started); ids may be "
        "ARRAY_INDEX (12_3). ? for any one of them (afterok:3?afterok:4); singleton (one job of "
        "this name at a time); aftercorr:12 (element N after 12_N).",
    ),
    (
        "kill_on_invalid_dep",
        ("--kill-on-invalid-dep",),
        "yesno",
        False,
        "Cancel the job if its dependency can never be met (also Slurm's =yes or =no).",
    ),
    (
        "array",
        ("--array", "-a"),
        "str",
        None,
        "One job per index: 0-99, 1,3,5-7, 0-15:4 (a step); 0-99%8 runs at most 8 at once.",
    ),
    (
        "time",
        ("--time", "-t"),
        "str",
        None,
        "Time limit as in Slurm: MINUTES (a bare number is minutes), M:S, H:M:S, D-H, D-H:M, "
        "D-H:M:S; or 45s, 2h30m, 1d; 0 or UNLIMITED for none; auto: none, and the runtime "
        "predicted from earlier runs orders the queue (as without --time).",
    ),
    (
        "signal",
        ("--signal",),
        "str",
        None,
        "[B:]SIG[@SECONDS] before the time limit, e.g. USR1@120 (default 60 s).",
    ),
    ("retries", ("--retries",), "int", 0, "Re-queue a failed job up to N times."),
    (
        "retry_on",
        ("--retry-on",),
        "str",
        None,
        "Ends that re-queue: failed,timeout,oom,cancelled,lost,gpu_oom (gpu_oom: CUDA out of "
        "memory, retried with --gpu-mem raised).",
    ),
    (
        "retry_delay",
        ("--retry-delay",),
        "str",
        None,
        "Wait before a retry (default 10s), doubling after each failed attempt up to 5m (or the "
        "delay, if longer); 0 retries at once.",
    ),
    (
        "mem_growth",
        ("--mem-growth",),
        "str",
        None,
        "What a gpu_oom retry multiplies --gpu-mem by (default 1.25), up to the largest GPU.",
    ),
    (
        "gpu_mem_over",
        ("--gpu-mem-over",),
        "str",
        None,
        "When the job uses more than its --gpu-mem on a shared GPU: report, stop or requeue "
        "(default: [memory] gpu_over).",
    ),
    ("policy", ("--policy",), "str", None, "Placement policy for this job."),
    (
        "gpu_ids",
        ("--gpu-ids",),
        "str",
        None,
        "Only these GPUs: 0,2 (one of them, unless --gpus asks for more).",
    ),
    ("exclude_gpus", ("--exclude-gpus",), "str", None, "Never these GPUs: 3."),
    ("gpu_type", ("--gpu-type",), "str", None, "Part of the GPU name: H100."),
    (
        "min_gpu_total_mem",
        ("--min-gpu-total-mem",),
        "str",
        None,
        "Only GPUs with this much memory: 40G.",
    ),
    (
        "min_compute_capability",
        ("--min-compute-capability",),
        "str",
        None,
        "Only GPUs at least this: 8.0.",
    ),
    (
        "topology",
        ("--topology",),
        "str",
        None,
        "Several GPUs: best (the default) takes the best-linked free ones; strict waits for "
        "GPUs linked as well as the box allows (one NVLink island).",
    ),
    (
        "cpus",
        ("--cpus", "--cpus-per-task", "-c"),
        "int",
        None,
        "CPU cores the job needs; it waits for them. Without it a GPU job counts one core but "
        "never waits for it; 0 needs none.",
    ),
    (
        "mem",
        ("--mem",),
        "str",
        None,
        "Host memory the job needs, e.g. 16G (a bare number is MiB, as in Slurm).",
    ),
    (
        "cluster",
        ("--cluster",),
        "str",
        None,
        "Hand the job to this Slurm cluster of the config ([clusters.NAME]); local: run it "
        "here. Default: the config's default_cluster, else here.",
    ),
    (
        "interactive",
        ("--interactive",),
        "flag",
        False,
        "A notebook or shell: never requeued or cancelled for idle GPUs ([idle] action).",
    ),
    (
        "pty",
        ("--pty",),
        "flag",
        False,
        "Run it on a terminal that `gpusched attach ID` connects to (its output, with the "
        "terminal's control sequences, goes to its output log).",
    ),
    (
        "preemptible",
        ("--preemptible",),
        "flag",
        False,
        "A job of a higher priority may stop it (checkpoint signal, grace, SIGTERM) and send it "
        "back to the queue. Default: the config's [preemption] default_preemptible.",
    ),
    (
        "no_preemptible",
        ("--no-preemptible",),
        "flag",
        False,
        "Never preempt it, whatever the config's default.",
    ),
    (
        "preempt_grace",
        ("--preempt-grace",),
        "str",
        None,
        "When preempted: between the checkpoint signal (--signal's, else SIGUSR1) and "
        "SIGTERM, e.g. 2m (default 60s, [preemption] grace).",
    ),
    (
        "container",
        ("--container",),
        "str",
        None,
        "Run the command in a container of this image (podman, or docker: [containers] "
        "runtime) that sees only the job's GPUs and its working directory.",
    ),
    (
        "container_opt",
        ("--container-opt",),
        "list",
        [],
        "An option for the runtime's `run`, e.g. --container-opt=--shm-size=8g (repeatable).",
    ),
    (
        "ntasks",
        ("--ntasks", "-n"),
        "int",
        None,
        "Slurm's task count: only 1 (a job is one command; start more tasks from it, e.g. "
        "torchrun, or use --array).",
    ),
    ("nodes", ("--nodes", "-N"), "str", None, "Slurm's node count: only 1 (this machine)."),
    ("gres", ("--gres",), "str", None, "Slurm's gpu[:TYPE]:N: the same as --gpus [TYPE:]N."),
    ("nice", ("--nice",), "int", None, "Slurm's: N lower in line (the same as --priority -N)."),
    (
        "export",
        ("--export",),
        "str",
        None,
        "Slurm's: ALL (the default: the job gets this environment), NONE, or NAME[=VALUE] "
        "items (only those; ALL,NAME=VALUE adds them to this environment).",
    ),
    (
        "no_requeue",
        ("--no-requeue",),
        "flag",
        False,
        "Slurm's: never run it again (gpusched's default, unless --retries).",
    ),
    (
        "output",
        ("--output", "-o"),
        "str",
        None,
        "Write the job's output to this file, and its errors too without --error, as sbatch "
        "does: %j job id, %A array id, %a index, %x name, %u user, %N host, %4j padded; "
        "relative to the working directory. Default: gpusched's own log (`gpusched logs`).",
    ),
    (
        "error",
        ("--error", "-e"),
        "str",
        None,
        "Write the job's errors to this file (the same patterns as --output).",
    ),
    (
        "open_mode",
        ("--open-mode",),
        "str",
        None,
        "truncate (the default) or append to the --output and --error files when the job "
        "first starts; a retried or requeued job's later runs append.",
    ),
)

# `resubmit`'s options, a subset of submit's: (SubmitOptions field, its flags, kind and
# help where they differ from submit's, else None; the field of the job's spec it changes,
# None for one that changes nothing in it). Each defaults to "not given".
_RESUBMIT_CHANGES = (
    (
        "gpus",
        None,
        "int",
        "GPUs instead of the job's (0 also drops its --gpu-mem and GPU constraints).",
        "gpus",
    ),
    ("gpu_mem", None, None, "Memory per GPU instead of the job's.", "gpu_mem_bytes"),
    ("name", ("--name", "--job-name", "-J"), None, "Another name.", "name"),
    ("priority", None, None, "Another priority.", "priority"),
    ("time", None, None, "Another time limit.", "time_limit_s"),
    ("cpus", ("--cpus", "-c"), None, "Other CPU cores.", "cpus"),
    ("mem", None, None, "Other host memory.", "mem_bytes"),
    ("hold", None, None, None, "hold"),
    ("wait", None, None, None, None),
    ("json", None, None, "Print the new id as JSON.", None),
)


def _resubmit_rows() -> tuple[OptionRow, ...]:
    by_field = {row[0]: row for row in SUBMIT}
    rows: list[OptionRow] = []
    for field, flags, kind, help_text, _ in _RESUBMIT_CHANGES:
        _, submit_flags, submit_kind, _, submit_help = by_field[field]
        kind = kind or submit_kind
        rows.append(
            (
                field,
                flags or submit_flags,
                kind,
                False if kind == "flag" else None,
                help_text or submit_help,
            )
        )
    return tuple(rows)


# resubmit's options as rows of the same shape as SUBMIT's.
RESUBMIT = _resubmit_rows()
# resubmit's options -> the field of the job's spec each one changes.
RESUBMIT_FIELDS = {field: spec for field, _, _, _, spec in _RESUBMIT_CHANGES if spec}


class SubmitOptions:
    """Everything `gpusched submit` accepts, before it is checked.

    A plain class, not a dataclass: the submit fast path imports this module, and the
    dataclasses machinery alone would cost every submit about 15 ms of start-up.
    """

    # Each option and its default; the lists are copied per instance.
    DEFAULTS: ClassVar[dict[str, Any]] = {"command": [], **{row[0]: row[3] for row in SUBMIT}}

    # The fields, one per row of SUBMIT (and the command), for type checkers only: a
    # bare annotation makes no class attribute. resubmit's --gpus is an int.
    command: list[str]
    gpus: str | int | None
    gpu_mem: str | None
    name: str
    priority: int
    cwd: str | None
    env: list[str]
    from_file: str | None
    wait: bool
    notify: bool
    json: bool
    hold: bool
    begin: str | None
    reservation: str | None
    after: list[str]
    dependency: list[str]
    kill_on_invalid_dep: bool
    array: str | None
    time: str | None
    signal: str | None
    retries: int
    retry_on: str | None
    retry_delay: str | None
    mem_growth: str | None
    gpu_mem_over: str | None
    policy: str | None
    gpu_ids: str | None
    exclude_gpus: str | None
    gpu_type: str | None
    min_gpu_total_mem: str | None
    min_compute_capability: str | None
    topology: str | None
    cpus: int | None
    mem: str | None
    cluster: str | None
    interactive: bool
    pty: bool
    preemptible: bool
    no_preemptible: bool
    preempt_grace: str | None
    container: str | None
    container_opt: list[str]
    ntasks: int | None
    nodes: str | None
    gres: str | None
    nice: int | None
    export: str | None
    no_requeue: bool
    output: str | None
    error: str | None
    open_mode: str | None

    def __init__(self, **values: Any):
        unknown = values.keys() - self.DEFAULTS.keys()
        if unknown:
            raise TypeError(f"unknown submit options: {sorted(unknown)}")
        for name, default in self.DEFAULTS.items():
            value = values.get(name, default)
            setattr(self, name, list(value) if isinstance(default, list) else value)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.DEFAULTS}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubmitOptions) and self.as_dict() == other.as_dict()

    def __repr__(self) -> str:
        return f"SubmitOptions({self.as_dict()!r})"
