"""The Slurm compatibility scenarios: each runs the same way against a one-node Slurm and
against gpusched, through a Side that hides how each is driven, and returns what a user
sees as {row: value}. tests/test_slurm_compat.py compares the two; docs/slurm-compat.md
lists the rows that differ on purpose.

A scenario submits with the options a Slurm user types (the same words on both sides, so
option parsing is part of what is compared) and a shell script (`sbatch --wrap` there,
`submit -- sh -c` here).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from conftest import Home, wait_until

# Slurm's states and reasons, in gpusched's words (what a user compares).
SLURM_STATES = {
    "COMPLETED": "succeeded",
    "FAILED": "failed",
    "TIMEOUT": "timeout",
    "CANCELLED": "cancelled",
    "PENDING": "pending",
    "RUNNING": "running",
    "OUT_OF_MEMORY": "oom",
    "NODE_FAIL": "lost",
}
ENDED = ("succeeded", "failed", "timeout", "cancelled", "oom", "lost")
SLOW_S = 200.0  # a one-minute Slurm time limit is enforced up to half a minute late


def reason_kind(reason: str) -> str:
    """gpusched's pending reason as the Slurm reason it corresponds to."""
    for start, kind in (
        ("held", "JobHeldUser"),
        ("waiting for", "Dependency"),
        ("behind job", "Priority"),
        ("needs", "Resources"),
        ("array", "JobArrayTaskLimit"),
    ):
        if reason.startswith(start):
            return kind
    if "can never be met" in reason:
        return "DependencyNeverSatisfied"
    return reason or "None"


class SlurmSide:
    name = "slurm"
    variable = "SLURM"  # the prefix of the job's own variables

    def __init__(self, node, workdir: Path):
        self.node, self.workdir = node, workdir

    def submit_lines(self, options: list[str], script: str) -> list[str]:
        out = self.node.run(
            "sbatch",
            "--parsable",
            f"--output={self.workdir}/%j.out",
            f"--chdir={self.workdir}",
            *options,
            "--wrap",
            script,
        ).stdout
        return out.split()

    def accepts(self, options: list[str]) -> bool:
        proc = self.node.run(
            "sbatch",
            "--test-only",
            f"--chdir={self.workdir}",
            "--output=/dev/null",
            *options,
            "--wrap",
            "true",
            check=False,
        )
        return proc.returncode == 0

    def control(self, *argv: str) -> int:
        return self.node.run("scontrol", *argv, check=False).returncode

    def cancel(self, job_id: str) -> None:
        self.node.run("scancel", job_id, check=False)

    def reserve(self, name: str) -> int:
        """A reservation of the whole node (both GPUs) for root, an hour from now, for an
        hour: the exit status."""
        return self.control(
            "create",
            "reservation",
            f"ReservationName={name}",
            "StartTime=now+1hour",
            "Duration=60",
            "Users=root",
            "Nodes=ALL",
        )

    def unreserve(self, name: str) -> int:
        return self.control("delete", f"ReservationName={name}")

    def admits(self, options: list[str]) -> int:
        """A held submit's exit status (then cancelled): --test-only cannot place a job
        in a reservation still to come ("Invalid time specified")."""
        proc = self.node.run(
            "sbatch",
            "--parsable",
            "--hold",
            f"--chdir={self.workdir}",
            "--output=/dev/null",
            *options,
            "--wrap",
            "true",
            check=False,
        )
        if proc.returncode == 0:
            self.cancel(proc.stdout.strip())
        return proc.returncode

    def seen(self, job_id: str) -> dict:
        shown = self.node.run("scontrol", "show", "job", "-o", job_id).stdout.split()
        fields = dict(word.split("=", 1) for word in shown if "=" in word)
        code, _, sig = fields.get("ExitCode", "0:0").partition(":")
        signal = int(sig or 0)
        return {
            "state": SLURM_STATES.get(fields["JobState"], fields["JobState"]),
            "exit_code": None if signal else int(code),
            "signal": signal or None,
            "reason": fields.get("Reason", "None"),
        }


class GpuschedSide:
    name = "gpusched"
    variable = "GPUSCHED"

    def __init__(self, home: Home, workdir: Path):
        self.home, self.workdir = home, workdir

    def submit_lines(self, options: list[str], script: str) -> list[str]:
        return self.home.run(
            "submit", *options, "--", "sh", "-c", script, cwd=self.workdir
        ).stdout.split()

    def accepts(self, options: list[str]) -> bool:
        proc = self.home.run(
            "submit", "--hold", *options, "--", "true", cwd=self.workdir, check=False
        )
        if proc.returncode == 0:
            self.home.run("cancel", *proc.stdout.split(), check=False)
        return proc.returncode == 0

    def control(self, *argv: str) -> int:
        return self.home.run(*argv, check=False).returncode

    def cancel(self, job_id: str) -> None:
        self.home.run("cancel", job_id, check=False)

    def reserve(self, name: str) -> int:
        return self.control(
            "reserve",
            "create",
            "--gpus",
            "0,1",
            "--start",
            "now+1hour",
            "--duration",
            "1h",
            "--name",
            name,
        )

    def unreserve(self, name: str) -> int:
        return self.control("reserve", "delete", name)

    def admits(self, options: list[str]) -> int:
        """A held submit's exit status (then cancelled)."""
        proc = self.home.run(
            "submit", "--hold", *options, "--", "true", cwd=self.workdir, check=False
        )
        if proc.returncode == 0:
            self.home.run("cancel", *proc.stdout.split(), check=False)
        return proc.returncode

    def seen(self, job_id: str) -> dict:
        job = json.loads(self.home.run("show", "--json", job_id).stdout)
        return {
            "state": job["state"],
            "exit_code": job["exit_code"],
            "signal": job["signal"],
            "reason": reason_kind(job["pending_reason"]),
        }


# -- helpers shared by the scenarios ---------------------------------------------------------
def submit(side, options: list[str], script: str) -> str:
    lines = side.submit_lines(options, script)
    assert len(lines) == 1, f"{side.name} printed {lines} for one submit"
    return lines[0]


def wait_seen(
    side, job_id: str, done: Callable[[dict], bool], what: str, timeout: float = 60.0
) -> dict:
    return wait_until(
        lambda: done(s := side.seen(job_id)) and s, f"{side.name} job {job_id} {what}", timeout
    )


def ended(side, job_id: str, timeout: float = 60.0) -> dict:
    return wait_seen(side, job_id, lambda s: s["state"] in ENDED, "to end", timeout)


def outcome(seen: dict) -> tuple:
    return (seen["state"], seen["exit_code"], seen["signal"])


def stamps(path: Path) -> list[float]:
    return [float(x) for x in path.read_text().split()] if path.exists() else []


# -- the scenarios ---------------------------------------------------------------------------
def exit_statuses(side) -> dict:
    jobs = {"true": "true", "exit 3": "exit 3", "kill -9": "kill -9 $$"}
    ids = {row: submit(side, [], script) for row, script in jobs.items()}
    return {row: outcome(ended(side, job_id)) for row, job_id in ids.items()}


def dependencies(side) -> dict:
    failing = submit(side, [], "exit 1")
    ok = submit(side, ["--dependency", f"afterok:{failing}"], "true")
    killed = submit(
        side, ["--dependency", f"afterok:{failing}", "--kill-on-invalid-dep=yes"], "true"
    )
    anyway = submit(side, ["--dependency", f"afterany:{failing}"], "true")
    notok = submit(side, ["-d", f"afternotok:{failing}"], "true")
    started = submit(side, ["-d", f"after:{failing}"], "true")
    ended(side, failing)
    never = wait_seen(
        side,
        ok,
        lambda s: s["reason"] not in ("Dependency", "None"),
        "to find its dependency unmet",
    )
    out = {
        "afterok on a failure": (never["state"], never["reason"]),
        "kill-on-invalid-dep": ended(side, killed)["state"],
    }
    for row, job_id in (("afterany", anyway), ("afternotok", notok), ("after", started)):
        out[row] = ended(side, job_id)["state"]
    side.cancel(ok)
    return out


def pending_reasons(side) -> dict:
    ids = [submit(side, ["--gpus", "2"], "sleep 60") for _ in range(3)]
    held = submit(side, ["--hold"], "true")
    wait_seen(side, ids[0], lambda s: s["state"] == "running", "to start")
    reasons = [
        wait_seen(side, i, lambda s: s["reason"] != "None", "to have a reason")["reason"]
        for i in ids[1:]
    ]
    # Slurm may give the next in line Priority until its scheduler looks at it again (on a
    # busy machine, up to its sched_interval, a minute): the reason it settles on is compared.
    deadline = time.monotonic() + 70
    while reasons[0] == "Priority" and time.monotonic() < deadline:
        time.sleep(1)
        reasons[0] = side.seen(ids[1])["reason"]
    out = {"next in line": reasons[0], "behind it": reasons[1], "held": side.seen(held)["reason"]}
    for job_id in (*ids, held):
        side.cancel(job_id)
    return out


def arrays(side) -> dict:
    var = side.variable
    array_id = submit(
        side,
        ["--array", "0-3%2"],
        f"date +%s.%N >> {side.workdir}/start; sleep 2; "
        f"date +%s.%N >> {side.workdir}/end; "
        f"echo ${var}_ARRAY_TASK_COUNT ${var}_ARRAY_TASK_MIN "
        f"${var}_ARRAY_TASK_MAX ${var}_ARRAY_TASK_STEP > {side.workdir}/vars"
        if side.name == "slurm"
        else f"date +%s.%N >> {side.workdir}/start; sleep 2; "
        f"date +%s.%N >> {side.workdir}/end; "
        f"echo ${var}_ARRAY_COUNT ${var}_ARRAY_MIN ${var}_ARRAY_MAX "
        f"${var}_ARRAY_STEP > {side.workdir}/vars",
    )
    states = [ended(side, f"{array_id}_{i}")["state"] for i in range(4)]
    starts, ends = stamps(side.workdir / "start"), stamps(side.workdir / "end")
    # The most elements running at once, from when each started and ended.
    events = sorted([(t, 1) for t in starts] + [(t, -1) for t in ends])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return {
        "states": states,
        "at most at once (%2)": most,
        "count min max step": (side.workdir / "vars").read_text().split(),
    }


def gpu_assignment(side) -> dict:
    ids = [
        submit(
            side,
            ["--gpus", "1"],
            f"echo $CUDA_VISIBLE_DEVICES ${side.variable}_JOB_GPUS > {side.workdir}/gpu{n}; "
            "sleep 2",
        )
        for n in range(2)
    ]
    for job_id in ids:
        ended(side, job_id)
    seen = sorted((side.workdir / f"gpu{n}").read_text().split() for n in range(2))
    return {
        "two jobs run at once on distinct GPUs": len({s[0] for s in seen}) == 2,
        "CUDA_VISIBLE_DEVICES": [s[0] for s in seen],
        "the job's GPU indices (SLURM_JOB_GPUS)": [s[1] for s in seen],
    }


def refused_operations(side) -> dict:
    job_id = submit(side, [], "true")
    ended(side, job_id)
    return {
        "hold a finished job": side.control("hold", job_id),
        "release a finished job": side.control("release", job_id),
    }


def reservation_refusals(side) -> dict:
    """What is refused around a reservation (scontrol's reservations, gpusched reserve):
    exit statuses, and submits into one accepted or not."""
    made = side.reserve("demo")
    try:
        return {
            "create a reservation": made,
            "create one that overlaps it": side.reserve("clash"),
            "submit into it (its user)": side.admits(["--reservation=demo"]),
            "submit into one that does not exist": side.admits(["--reservation=nope"]),
            "delete one that does not exist": side.unreserve("nope"),
            "delete it": side.unreserve("demo"),
            "submit into it once deleted": side.admits(["--reservation=demo"]),
        }
    finally:
        side.unreserve("demo")
        side.unreserve("clash")


def cancel_running(side) -> dict:
    job_id = submit(side, [], "sleep 60")
    wait_seen(side, job_id, lambda s: s["state"] == "running", "to start")
    side.cancel(job_id)
    return {"state": ended(side, job_id)["state"]}


def time_limit_and_signal(side) -> dict:
    marks = side.workdir
    # B: the main shell alone, which traps the warning; without B: a child that would.
    # A lead of 10 s: Slurm sends it 20-50 s into the minute (see test_slurm_scenarios.py),
    # gpusched at 50 s, both when the job's processes have set their traps.
    batch = submit(
        side,
        ["--time", "1", "--signal", "B:USR1@10"],
        f"trap 'date +%s.%N > {marks}/batch' USR1; while :; do sleep 1; done",
    )
    steps = submit(
        side,
        ["--time", "1", "--signal", "USR1@10"],
        f'python3 -c "import signal, time; signal.signal(signal.SIGUSR1, '
        f"lambda *_: open('{marks}/child', 'w').write(str(time.time()))); "
        'time.sleep(600)"; echo',
    )
    out = {}
    for row, job_id, mark in (("B:", batch, "batch"), ("no B:", steps, "child")):
        seen = ended(side, job_id, timeout=SLOW_S)
        out[f"{row} state"] = seen["state"]
        out[f"{row} warned"] = (marks / mark).exists()
    return out


# The option lines a Slurm user types: accepted, or refused at submit, on each side.
OPTION_LINES = [
    ["--time=0"],
    ["--time=UNLIMITED"],
    ["--time=infinite"],
    ["--time=1.5"],
    ["--time=2:30:00"],
    ["--time=1-12"],
    ["-t", "90"],
    ["-J", "x"],
    ["--job-name=x"],
    ["-D", "."],
    ["-n", "1"],
    ["-n", "4"],
    ["-N", "1"],
    ["-N", "2"],
    ["-c", "2"],
    ["--mem=100"],
    ["-G", "1"],
    ["--gpus=1"],
    ["--gres=gpu:1"],
    ["--gpus-per-node=1"],
    ["--gres=tpu:1"],
    ["--nice=5"],
    ["--export=ALL,FOO=1"],
    ["--export=NONE"],
    ["--array=0-3%2"],
    ["-a", "1,3,5-7"],
    ["--array=0-15:4"],
    ["--kill-on-invalid-dep=yes"],
    ["-t", "5", "--signal=B:USR1@60"],
    ["-t", "5", "--signal=USR1"],
    ["--begin=16:00"],
    ["--begin=now+1hour"],
    ["--begin=now+90"],
    ["--begin=tomorrow"],
    ["--begin=midnight"],
    ["--begin=teatime"],
    ["--begin=2030-12-24T08:00"],
    ["--begin=12/24"],
    ["-b", "noon"],
    ["--begin=soon"],
    ["--begin=25:00"],
    ["-H"],
    ["--hold"],
    ["--no-requeue"],
    ["--requeue"],
    ["-p", "debug"],
    ["-o", "x.out"],
    ["-e", "x.err"],
    ["--open-mode=append"],
    ["-w", "localhost"],
    ["-q", "normal"],
]


def option_parsing(side) -> dict:
    return {" ".join(line): side.accepts(line) for line in OPTION_LINES}


def dependency_kinds(side) -> dict:
    """singleton, `?` (any of), aftercorr and --kill-on-invalid-dep=no, and a mix of `,`
    and `?` (Slurm reads it as all `?`; gpusched refuses it)."""
    work, task = (
        side.workdir,
        ("$SLURM_ARRAY_TASK_ID" if side.name == "slurm" else "$GPUSCHED_ARRAY_INDEX"),
    )
    submit(side, ["-J", "one"], f"while [ ! -e {work}/go ]; do sleep 0.1; done; exit 3")
    single = submit(side, ["-J", "one", "-d", "singleton"], "true")
    failing, ok = submit(side, [], "exit 1"), submit(side, [], "true")
    parents = submit(side, ["--array", "0-3"], f'[ "{task}" != 1 ]')
    children = submit(side, ["--array", "0-4", "-d", f"aftercorr:{parents}"], "true")
    either = submit(side, ["-d", f"afterok:{failing}?afterok:{ok}"], "true")
    neither = [
        submit(
            side,
            [f"--kill-on-invalid-dep={kill}", "-d", f"afterok:{failing}?afternotok:{ok}"],
            "true",
        )
        for kill in ("no", "yes")
    ]
    out = {
        "singleton while one of its name runs": wait_seen(
            side,
            single,
            lambda s: s["reason"] not in ("None", "waiting to be placed"),
            "to have a reason",
        )["reason"]
    }
    (work / "go").touch()
    out["singleton after it failed"] = ended(side, single)["state"]
    out["? (any of) with one met"] = ended(side, either)["state"]
    out["? with none met, --kill-on-invalid-dep=no"] = wait_seen(
        side,
        neither[0],
        lambda s: s["reason"] == "DependencyNeverSatisfied",
        "to be never satisfiable",
    )["state"]
    out["? with none met, --kill-on-invalid-dep=yes"] = ended(side, neither[1])["state"]
    out["aftercorr elements"] = [
        wait_seen(
            side,
            f"{children}_{i}",
            lambda s: s["state"] in ENDED or s["reason"] == "DependencyNeverSatisfied",
            "to be decided",
        )["state"]
        for i in range(5)
    ]
    out["',' and '?' mixed"] = side.accepts(["-d", f"afterok:{ok},afterok:{ok}?afterany:{ok}"])
    for job_id in (neither[0], *(f"{children}_{i}" for i in range(5))):
        side.cancel(job_id)
    return out


def output_files(side) -> dict:
    """-o/-e with %j, %x, %A_%a, relative to the working directory, and --open-mode."""
    work = side.workdir
    for name in ("kept.out", "fresh.out"):
        (work / name).write_text("before\n")
    both = submit(side, ["-o", "o-%j.out"], "echo out; echo err >&2")
    apart = submit(side, ["-o", "a-%j.out", "-e", "a-%j.err"], "echo out; echo err >&2")
    named = submit(side, ["-J", "named", "-o", "%x.out"], "echo named")
    array_id = submit(side, ["--array", "0-1", "-o", "arr-%A_%a.out"], "echo element")
    kept = submit(side, ["-o", "kept.out", "--open-mode=append"], "echo new")
    fresh = submit(side, ["-o", "fresh.out"], "echo new")
    for job_id in (both, apart, named, kept, fresh, f"{array_id}_0", f"{array_id}_1"):
        ended(side, job_id)

    def read(name: str) -> str | None:
        return (work / name).read_text() if (work / name).exists() else None

    return {
        "-o %j: output and errors": read(f"o-{both}.out"),
        "-o and -e: output": read(f"a-{apart}.out"),
        "-o and -e: errors": read(f"a-{apart}.err"),
        "-J named -o %x.out": read("named.out"),
        "--array -o %A_%a": [read(f"arr-{array_id}_{i}.out") for i in (0, 1)],
        "--open-mode=append": read("kept.out"),
        "truncate, the default": read("fresh.out"),
    }


SCENARIOS: dict[str, Callable] = {
    "exit statuses": exit_statuses,
    "dependencies": dependencies,
    "pending reasons": pending_reasons,
    "arrays": arrays,
    "gpu assignment": gpu_assignment,
    "refused operations": refused_operations,
    "reservation refusals": reservation_refusals,
    "cancel": cancel_running,
    "time limit and signal": time_limit_and_signal,
    "option parsing": option_parsing,
    "dependency kinds": dependency_kinds,
    "output files": output_files,
}


def settle(fn: Callable, side) -> dict:
    """A scenario on one side, timed (printed with -s; no assertion reads it)."""
    began = time.monotonic()
    try:
        return fn(side)
    finally:
        print(f"{side.name}: {time.monotonic() - began:.1f} s")
