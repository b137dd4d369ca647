"""The options of `ls`, `show`, `gpus`, `wait`, `cancel`, `hold`, `release`, `logs` and
`usage`, in one table per command.

The typer commands (job_cmds.py, gpu_cmds.py, usage_cmds.py, through
submit_cmds.with_options), the fast path's parser (client/cmdline.py) and the MCP server's
tools (gpusched/mcp/) read these tables, so an option is declared once. Rows are shaped as client/submit/options.py's: (field, flags, kind, default,
help), and a metavar where --help shows one. Plain tuples: the fast path imports this.
"""

from __future__ import annotations

JSON_HELP = "Print JSON (stable field names) instead of a table."
JOB_ID_HELP = "Job id, or ARRAY_INDEX (12_3) for one element of an array."
JOB_IDS_HELP = "Job ids; an array's id means all its elements, ARRAY_INDEX (12_3) one."
JOB_IDS = "JOBID..."
# What `gpus --format` prints without `--query`, as nvidia-smi has a default set.
GPUS_DEFAULT_QUERY = (
    "index,uuid,name,memory.total,memory.used,memory.reserved,utilization.gpu,health,jobs"
)

_JSON = ("as_json", ("--json",), "flag", False, JSON_HELP)

LS = (
    ("all_jobs", ("--all", "-a"), "flag", False, "Include finished jobs."),
    ("expand", ("--expand", "-r"), "flag", False, "One line per array element."),
    _JSON,
    ("users", ("--user", "-u"), "str", None, "Only these users' jobs."),
    ("me", ("--me",), "flag", False, "Only your own jobs."),
    (
        "states",
        ("--state", "-t"),
        "str",
        None,
        "Only jobs in these states; a finished state implies --all.",
    ),
    (
        "names",
        ("--name", "-n"),
        "str",
        None,
        "Only jobs of these names; wildcards like 'sweep-*'.",
        "NAME[,NAME]",
    ),
    (
        "fields",
        ("--format", "-O"),
        "str",
        None,
        "Plain columns for scripts, one line per job: "
        "jobid,user,state,reason,... (README lists the fields).",
        "FIELDS",
    ),
    ("noheader", ("--noheader",), "flag", False, "With --format: no header line."),
    (
        "last",
        ("--last",),
        "int",
        None,
        "Only the N most recent matching jobs (the highest ids), oldest first.",
        "N",
    ),
    (
        "start",
        ("--start",),
        "flag",
        False,
        "Pending jobs only, with when each is forecast to start and its 80 % interval "
        "(as squeue --start).",
    ),
)
SHOW = (_JSON,)
GPUS = (
    _JSON,
    (
        "query",
        ("--query",),
        "str",
        None,
        "Fields as nvidia-smi --query-gpu names them: index,name,memory.used,...",
    ),
    (
        "fmt",
        ("--format",),
        "str",
        None,
        "csv[,noheader][,nounits] (the default with --query) "
        f"or json; without --query, the fields {GPUS_DEFAULT_QUERY.replace(',', ', ')}.",
    ),
    (
        "topology",
        ("--topology",),
        "flag",
        False,
        "The links between the GPUs (NVLink, PCIe), as nvidia-smi topo -m prints them.",
    ),
)
LOGS = (
    ("follow", ("--follow", "-f"), "flag", False, "Keep printing until the job ends."),
    ("stderr", ("--stderr",), "flag", False, "Show standard error instead of output."),
    (
        "plain",
        ("--plain",),
        "flag",
        False,
        "Leave out terminal control sequences (colours, cursor moves: a --pty job's).",
    ),
)

WAIT = (
    (
        "notify",
        ("--notify",),
        "flag",
        False,
        "When they end, tell this desktop (notify-send) or ring this terminal's bell.",
    ),
    (
        "keep_waiting",
        ("--keep-waiting",),
        "flag",
        False,
        "Wait on a job that can never start (its dependency failed) instead of failing.",
    ),
)

USAGE = (
    (
        "since",
        ("--since",),
        "str",
        None,
        "Only the last DURATION, e.g. 7d, 12h (default: everything the queue remembers).",
        "DURATION",
    ),
    ("by", ("--by",), "str", "user", "Group by user or by job name.", "user|name"),
    _JSON,
)

# Each command of the fast path -> (its arguments: "" none, "one" job id, "many" job ids;
# its options).
FAST_COMMANDS = {
    "ls": ("", LS),
    "show": ("one", SHOW),
    "gpus": ("", GPUS),
    "wait": ("many", WAIT),
    "cancel": ("many", ()),
    "hold": ("many", ()),
    "release": ("many", ()),
    "logs": ("one", LOGS),
}
