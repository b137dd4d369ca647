"""`gpusched top`: golden frames of the pure render, escaping, fitting, keys, --once end to end."""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import MappingProxyType

import pytest

from goldens import check_golden
from gpusched.core.models import GpuInfo, GpuProcess, Inventory
from gpusched.tui.model import (
    DaemonInfo,
    HostInfo,
    ProcHost,
    Snapshot,
    TopJob,
    ViewState,
    apply_key,
)
from gpusched.tui.render import SORT_KEYS, layout_for, printable, render, to_text

GIB = 2**30
NOW = 1_700_000_000.0
EVIL_NAME = "\x1b[31m[/red]x\x07"
ME = ViewState(my_uid=1000, my_user="me")


def test_top_colours_loads_by_the_configs_percentages():
    from gpusched.core.config import Settings
    from gpusched.tui.app import my_view

    defaults = Settings()
    assert (ViewState().warn_pct, ViewState().crit_pct) == (
        defaults.top_warn_pct,
        defaults.top_crit_pct,
    )
    view = my_view(Settings(top_warn_pct=10.0, top_crit_pct=20.0))
    assert (view.warn_pct, view.crit_pct, view.my_uid) == (10.0, 20.0, os.getuid())


def _proc(
    pid: int, gpu: str, gib: float, user: str | None, command: str | None, visible: bool = True
) -> GpuProcess:
    return GpuProcess(
        pid=pid,
        gpu_uuid=gpu,
        used_mem_bytes=int(gib * GIB),
        user=user,
        command=command,
        is_visible=visible,
    )


def _gpus() -> tuple[GpuInfo, ...]:
    busy = GpuInfo(
        index=0,
        uuid="GPU-0",
        name="NVIDIA H100 80GB HBM3",
        mem_total_bytes=80 * GIB,
        mem_used_bytes=74 * GIB,
        util_pct=97.0,
        bus_id="00000000:18:00.0",
        temperature_c=71,
        power_w=612.4,
        power_limit_w=700.0,
        processes=(
            _proc(1001, "GPU-0", 60, "alice", "python train.py --epochs 90"),
            _proc(2002, "GPU-0", 10, "bob", "jupyter-kernel"),
            _proc(3003, "GPU-0", 4, None, None, visible=False),
        ),
    )
    migs = tuple(
        GpuInfo(
            index=1,
            uuid=f"MIG-1-{gi}",
            name="NVIDIA A100 MIG 3g.40gb",
            mem_total_bytes=40 * GIB,
            mem_used_bytes=used * GIB,
            parent_index=1,
            gpu_instance_id=gi,
            bus_id="00000000:28:00.0",
            processes=procs,
        )
        for gi, used, procs in (
            (1, 18, (_proc(1101, "MIG-1-1", 18, "me", "python serve.py"),)),
            (2, 0, ()),
        )
    )
    mig_parent = GpuInfo(
        index=1,
        uuid="GPU-1",
        name="NVIDIA A100-SXM4-80GB",
        mem_total_bytes=80 * GIB,
        mem_used_bytes=18 * GIB,
        util_pct=35.0,
        bus_id="00000000:28:00.0",
        temperature_c=48,
        power_w=180.0,
        power_limit_w=400.0,
        mig_devices=migs,
    )
    lost = GpuInfo(
        index=2,
        uuid="GPU-2",
        name="Unknown GPU",
        mem_total_bytes=0,
        is_healthy=False,
        health_reason="GPU has fallen off the bus",
    )
    idle = GpuInfo(
        index=3,
        uuid="GPU-3",
        name="NVIDIA H100 80GB HBM3",
        mem_total_bytes=80 * GIB,
        mem_used_bytes=1 * GIB,
        util_pct=3.0,
        bus_id="00000000:48:00.0",
        temperature_c=33,
        power_w=71.0,
        power_limit_w=700.0,
    )
    return busy, mig_parent, lost, idle


def _job(job_id: int, state: str, user: str, uid: int, name: str, **fields) -> TopJob:
    return TopJob(
        id=job_id,
        name=name,
        user=user,
        uid=uid,
        state=state,
        command=fields.pop("command", ("python", f"{name}.py")),
        submitted_at=fields.pop("submitted_at", NOW - 3600 + job_id),
        **fields,
    )


def _jobs() -> tuple[TopJob, ...]:
    return (
        _job(
            7,
            "running",
            "alice",
            1001,
            "train-llm",
            gpu_indices=(0,),
            gpus_requested=1,
            started_at=NOW - 5025,
            time_limit_s=8 * 3600.0,
            progress_pct=62.0,
            progress_message="epoch 56/90",
        ),
        _job(
            8,
            "running",
            "me",
            1000,
            "serve",
            gpu_indices=(1,),
            gpu_uuids=("MIG-1-1",),
            gpus_requested=1,
            gpu_mem_bytes=20 * GIB,
            started_at=NOW - 640,
        ),
        _job(
            9,
            "running",
            "me",
            1000,
            "eval",
            gpu_indices=(3,),
            gpus_requested=1,
            gpu_mem_bytes=20 * GIB,
            started_at=NOW - 4,
        ),
        _job(
            10,
            "pending",
            "bob",
            1002,
            "sweep-a",
            gpus_requested=2,
            pending_reason="needs 2 whole GPUs, 1 is free (GPU 2 is lost)",
        ),
        _job(
            11,
            "pending",
            "me",
            1000,
            EVIL_NAME,
            gpus_requested=1,
            gpu_mem_bytes=30 * GIB,
            priority=5,
            command=("sh", "-c", "printf '\x1b]0;pwned\x07'"),
            pending_reason="waiting for 30.0 GiB on one GPU (most free: 6.0 GiB)",
        ),
        *(
            _job(
                n,
                "pending",
                "carol",
                1003,
                f"grid-{n}",
                gpus_requested=1,
                pending_reason="waiting behind higher priority jobs",
            )
            for n in range(12, 18)
        ),
    )


def sample_snapshot(**changes) -> Snapshot:
    """A fixed frame: nothing in it depends on the clock, the host or the time zone."""
    fields = {
        "now": NOW,
        "utc_offset_s": 0,
        "version": "0.1.0",
        "inventory": Inventory(
            gpus=_gpus(),
            backend="nvml",
            driver_version="550.54.15",
            cuda_version="12.4",
            read_at=NOW,
        ),
        "host": HostInfo(
            hostname="gpubox",
            cpu_pct=37.5,
            mem_used_bytes=200 * GIB,
            mem_total_bytes=256 * GIB,
            load_avg=(5.12, 4.8, 4.01),
        ),
        "daemon": DaemonInfo(pid=4242, uptime_s=3 * 86400 + 7200, version="0.1.0"),
        "reserved_bytes": MappingProxyType({"GPU-3": 19 * GIB, "MIG-1-1": 2 * GIB}),
        "pid_jobs": MappingProxyType({1001: 7, 1101: 8}),
        "jobs": _jobs(),
        "proc_host": MappingProxyType(
            {
                1001: ProcHost(cpu_pct=101.3, rss_bytes=12 * GIB, started_at=NOW - 5000),
                1101: ProcHost(cpu_pct=12.0, rss_bytes=3 * GIB, started_at=NOW - 630),
                2002: ProcHost(),
            }
        ),
    }
    fields.update(changes)
    return Snapshot(**fields)


def frame(width: int, height: int | None = None, view: ViewState = ME, **changes) -> str:
    return to_text(render(sample_snapshot(**changes), view, width, height), width)


def coloured(width: int, view: ViewState = ME, **changes) -> str:
    """The frame as a colour terminal would receive it, escape sequences included."""
    import io

    from rich.console import Console

    console = Console(
        file=io.StringIO(),
        width=width,
        force_terminal=True,
        color_system="standard",
        legacy_windows=False,
        _environ={},
    )
    console.print(render(sample_snapshot(**changes), view, width, None))
    return console.file.getvalue()


@pytest.mark.parametrize("width", [60, 80, 100, 140])
def test_golden_frame(width):
    check_golden(f"top_{width}.txt", frame(width, 60))


def test_golden_frame_of_a_short_terminal():
    check_golden("top_80x24.txt", frame(80, 24))


@pytest.mark.parametrize(
    "width, layout",
    [
        (59, "minimal"),
        (79, "minimal"),
        (80, "compact"),
        (139, "compact"),
        (140, "full"),
        (250, "full"),
    ],
)
def test_layout_by_width(width, layout):
    assert layout_for(width) == layout


def test_golden_frames_show_every_kind_of_row():
    # Guards the goldens: a fixture that lost its MIG, lost GPU or outside rows would
    # keep matching a golden file rewritten from it.
    text = frame(140)
    for needle in (
        "└ 1/1",
        "└ 1/2",
        "GPU has fallen off the bus",
        "external",
        "3003",
        "(pid in another namespace)",
        "Running (3)",
        "Pending (8)",
        "62%",
        "needs 2 whole GPUs",
        "1h23m / 8h00m",
        "19.0 GiB",
    ):
        assert needle in text, needle


def test_job_name_with_escape_sequence_is_shown_escaped():
    raw = coloured(140)
    assert "\x1b[31m[" not in raw and "\x07" not in raw
    assert r"\x1b[31m[/red]x\x07" in raw  # its markup is not interpreted either
    assert r"\x1b[31m[/red]x\x07" in frame(140)


def test_escape_sequences_in_commands_are_shown_escaped():
    busy, *rest = sample_snapshot().inventory.gpus
    evil = GpuProcess(
        pid=5005,
        gpu_uuid="GPU-0",
        used_mem_bytes=GIB,
        user="me",
        command="sh -c '\x1b]0;pwned\x07\x1b[2J'",
    )
    gpus = (GpuInfo(**{**busy.__dict__, "processes": busy.processes + (evil,)}), *rest)
    inventory = Inventory(gpus=gpus, backend="nvml")
    raw = coloured(140, inventory=inventory)
    assert "\x1b]0;" not in raw and "\x1b[2J" not in raw
    assert r"sh -c '\x1b]0;pwned\x07\x1b[2J'" in raw


def test_printable_escapes_controls_only():
    assert printable("ok name-1 ünï") == "ok name-1 ünï"
    assert printable("a\tb\nc\x1b[0m\x7f") == r"a\tb\nc\x1b[0m\x7f"


@pytest.mark.parametrize("width", [40, 60, 80, 100, 140, 200])
@pytest.mark.parametrize("height", [5, 8, 12, 16, 20, 24, 30, 40, 60])
def test_frame_fits_the_terminal(width, height):
    lines = frame(width, height).splitlines()
    assert len(lines) <= height
    assert all(len(line) <= width for line in lines)


def test_short_terminal_cuts_pending_rows_first_and_keeps_every_gpu():
    text = frame(140, 35)
    assert "... 2 more" in text.split("Pending (8)")[1]
    assert "Running (3)" in text and "1001" in text and "3003" in text
    assert all(label in text for label in ("│      0 ", "└ 1/2", "│      3 "))


def _busy_box(gpu_count: int) -> dict:
    """A full box: every GPU busy with two processes and a running job of its own."""
    gpus = tuple(
        GpuInfo(
            index=i,
            uuid=f"GPU-{i}",
            name="NVIDIA H100 80GB HBM3",
            mem_total_bytes=80 * GIB,
            mem_used_bytes=70 * GIB,
            util_pct=99.0,
            processes=(
                _proc(5000 + i, f"GPU-{i}", 60, "alice", "python a.py"),
                _proc(6000 + i, f"GPU-{i}", 10, "bob", "jupyter"),
            ),
        )
        for i in range(gpu_count)
    )
    running = tuple(
        _job(
            100 + i,
            "running",
            "alice",
            1001,
            f"run-{i}",
            gpu_indices=(i,),
            gpus_requested=1,
            started_at=NOW - 60,
        )
        for i in range(gpu_count)
    )
    pending = tuple(j for j in _jobs() if j.state == "pending")
    return {
        "inventory": Inventory(gpus=gpus, backend="nvml"),
        "jobs": running + pending,
        "pid_jobs": MappingProxyType({5000 + i: 100 + i for i in range(gpu_count)}),
    }


@pytest.mark.parametrize("gpu_count", [4, 8, 16, 64])
@pytest.mark.parametrize("width, height", [(80, 24), (100, 30), (60, 20)])
def test_a_short_terminal_always_shows_the_pending_count_and_the_first_reason(
    gpu_count, width, height
):
    text = frame(width, height, **_busy_box(gpu_count))
    assert len(text.splitlines()) <= height
    pending = text.split("Pending (8)")[1]  # the count, in the panel's title
    # The first pending job in the order placement considers them (priority 5), its reason.
    assert re.search(r"^│ +11 +me .* waiting for 30", pending, re.M), text
    assert re.search(r"^│ \.\.\. [1-7] more", pending, re.M), text


def test_a_cancelling_job_says_so_in_the_running_panel():
    stubborn = _job(
        20,
        "running",
        "me",
        1000,
        "stubborn",
        gpu_indices=(3,),
        gpus_requested=1,
        started_at=NOW - 30,
        cancelling=True,
    )
    for width in (60, 80, 140):
        text = frame(width, jobs=_jobs() + (stubborn,))
        assert re.search(r"│ +20 +me +stubborn +cancelling ", text), text
        assert re.search(r"│ +9 +me +eval +running ", text), text
    assert " STATE " not in frame(140)  # only while a job is cancelling


def test_many_pending_jobs_end_in_a_count():
    jobs = sample_snapshot().jobs + tuple(
        _job(n, "pending", "dave", 1004, f"bulk-{n}", gpus_requested=1) for n in range(100, 1100)
    )
    text = frame(100, 40, jobs=jobs)
    assert "Pending (1008)" in text
    assert re.search(r"\.\.\. \d+ more", text.split("Pending (1008)")[1])
    assert len(text.splitlines()) <= 40


def test_other_users_rows_are_dimmed():
    raw = coloured(140).splitlines()
    alice = next(line for line in raw if "python train.py --epochs 90" in line)
    mine = next(line for line in raw if "python serve.py" in line and "1101" in line)
    assert "\x1b[2m" in alice and "\x1b[2m" not in mine


def test_only_mine_hides_other_users():
    text = frame(140, view=apply_key(ME, "u", len(SORT_KEYS)))
    assert "only mine" in text
    assert "alice" not in text and "bob" not in text and "carol" not in text
    assert "serve" in text and "Running (2)" in text and "Pending (1)" in text


def test_sort_cycles_and_orders_processes():
    view = ME
    names = []
    for _ in SORT_KEYS:
        names.append(SORT_KEYS[view.sort_index])
        view = apply_key(view, "s", len(SORT_KEYS))
    assert names == list(SORT_KEYS) and view.sort_index == 0
    by_mem = frame(140, view=ViewState(my_uid=1000, my_user="me", sort_index=1))
    panel = by_mem.split("Processes")[1].split("Running")[0]
    pids = re.findall(r"^│ +\S+ +(\d{4}) ", panel, re.M)
    assert pids == ["1001", "1101", "2002", "3003"], by_mem


def test_keys_pause_help_and_quit():
    paused = apply_key(ME, "p", len(SORT_KEYS))
    assert paused.paused and "PAUSED" in frame(100, view=paused)
    assert not apply_key(paused, "p", len(SORT_KEYS)).paused
    helped = apply_key(ME, "?", len(SORT_KEYS))
    text = frame(100, 30, view=helped)
    assert "Help" in text and "pause / resume" in text and "Processes" not in text
    assert not apply_key(helped, "?", len(SORT_KEYS)).show_help
    assert apply_key(ME, "q", len(SORT_KEYS)).quit
    assert apply_key(ME, "x", len(SORT_KEYS)) == ME


def test_no_daemon_banner():
    text = frame(80, daemon=None, jobs=(), banner="gpusched daemon is not running: no queue")
    assert "daemon not running" in text and "gpusched daemon is not running: no queue" in text
    assert "Running" not in text and "│      3 " in text


def test_inventory_problem_is_shown():
    inventory = Inventory(backend="nvml", problem="NVML found no NVIDIA GPUs (driver 550)")
    text = frame(60, inventory=inventory, jobs=())
    assert "No GPUs: NVML found no NVIDIA GPUs" in text and "GPUs ─" not in text


def test_snapshot_is_immutable():
    import dataclasses

    snapshot = sample_snapshot()
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.now = 0.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        snapshot.pid_jobs[1] = 2  # type: ignore[index]


def test_top_job_reads_the_daemons_job_fields():
    from gpusched.core.models import Job, JobState, Request, job_to_dict

    job = Job(
        id=3,
        command=("python", "x.py"),
        cwd="/",
        uid=7,
        user="u",
        name="n",
        request=Request(2, 5 * GIB),
        priority=4,
        state=JobState.PENDING,
        submitted_at=NOW,
        pending_reason="why",
    )
    top = TopJob.from_dict(job_to_dict(job))
    assert (
        top.id,
        top.name,
        top.user,
        top.uid,
        top.state,
        top.gpus_requested,
        top.gpu_mem_bytes,
        top.priority,
        top.command,
        top.pending_reason,
    ) == (3, "n", "u", 7, "pending", 2, 5 * GIB, 4, ("python", "x.py"), "why")
    # What `snapshot` adds to a running job that reported progress (handlers.with_progress).
    report = {"fraction": 0.25, "message": "epoch 1/4", "updated_at": NOW}
    running = TopJob.from_dict({**job_to_dict(job), "state": "running", "progress": report})
    assert (running.progress_pct, running.progress_message) == (25.0, "epoch 1/4")


@pytest.mark.e2e
def test_host_sampler_reads_this_process_and_tolerates_a_missing_one():
    import psutil

    from gpusched.tui.snapshot import HostSampler

    sampler = HostSampler()
    host = sampler.host()
    assert host.hostname and host.mem_total_bytes and host.cpu_pct is not None
    dead = psutil.Popen(["true"])
    dead.wait()
    found = sampler.processes({os.getpid(), dead.pid})
    me = found[os.getpid()]
    assert me.cpu_pct is not None and me.rss_bytes and me.started_at
    assert found[dead.pid] == ProcHost()
    again = sampler.processes({os.getpid()})  # the second reading measures since the first
    assert again[os.getpid()].cpu_pct is not None


# -- `gpusched top --once` end to end -------------------------------------------------------
def test_top_once_shows_gpus_and_jobs_from_the_daemon(home):
    home.start()
    running = home.submit("--gpus", "1", "--name", "trainer", "--", "sleep", "120")
    home.wait_state(running, "running")
    # --name refuses control characters; a name taken from the program's file name may hold them
    waiting = home.submit("--gpus", "4", "--", "/bin/\x1b[31mevil", "1")
    out = home.run("top", "--once").stdout
    assert "\x1b" not in out  # stdout is a pipe: plain text
    assert out.count("Simulated GPU") == 4 and "simulated GPUs" in out
    assert "Running (1)" in out and "trainer" in out
    assert "Pending (1)" in out and r"\x1b[31mevil" in out
    assert re.search(rf"│ +{running} +\S+ +trainer", out) and re.search(rf"│ +{waiting} ", out)
    assert "daemon not running" not in out


def test_top_once_without_a_daemon_reads_the_gpus_and_says_so(home):
    home.state.mkdir(parents=True)
    (home.state / "simulated_processes.toml").write_text(
        '[[process]]\ngpu = 2\npid = 999999\nuser = "someone"\nmemory = "5GiB"\n'
        'command = "outside-job"\n'
    )
    out = home.run("top", "--once", env={"COLUMNS": "100"}).stdout
    assert "gpusched daemon is not running" in out
    assert out.count("Simulated GPU") == 4
    assert re.search(r"│ +2 +999999 +someone +external +5\.0 GiB +N/A", out), out
    assert home.run("daemon", "status", check=False).returncode == 3  # top started none


def test_top_refuses_an_interval_that_would_spin(home):
    proc = home.run("top", "--interval", "0", check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("Error: --interval must be at least 0.1 seconds")


def write_screenshot(path: Path, width: int = 140) -> None:
    """docs/top.svg: this file's fixed snapshot at 140 columns, exported by rich."""
    from rich.console import Console

    console = Console(
        record=True,
        width=width,
        force_terminal=True,
        color_system="truecolor",
        file=open(os.devnull, "w"),
        legacy_windows=False,
        _environ={},
    )
    console.print(render(sample_snapshot(), ME, width, None))
    console.save_svg(str(path), title="gpusched top")


if __name__ == "__main__":  # python tests/test_tui.py docs/top.svg
    import sys

    write_screenshot(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/top.svg"))


def test_array_elements_are_named_by_their_array_index():
    """As ls -r and squeue name them: element 2 of array 58 is 58_2, not job 60."""
    jobs = (
        _job(
            60,
            "running",
            "me",
            1000,
            "sweep",
            gpu_indices=(0,),
            gpus_requested=1,
            started_at=NOW - 60,
            array_id=58,
            array_index=2,
        ),
        _job(
            61,
            "pending",
            "me",
            1000,
            "sweep",
            gpus_requested=1,
            array_id=58,
            array_index=3,
            pending_reason="waiting",
        ),
    )
    text = frame(140, 40, jobs=jobs)
    rows = [line.strip("│ ").split()[0] for line in text.splitlines() if " sweep " in line]
    assert rows == ["58_2", "58_3"], text
