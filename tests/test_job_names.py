"""A job's default name is the program it runs, past interpreters and launchers
(core/spec/jobname.py): what ls, show, top, history and usage call a job without --name; and
history's walk for runs by that name on a real store."""

from __future__ import annotations

import json
import shlex
from types import SimpleNamespace

import pytest

from gpusched.core.config import load_settings
from gpusched.core.models import Inventory, Job, JobState, Request
from gpusched.core.sched.memestimate import job_key
from gpusched.core.spec.jobname import program_name, program_name_of_json
from gpusched.daemon.jobs import gpumemory
from gpusched.store.database import Store


@pytest.mark.parametrize(
    "command, name",
    [
        # The script, not its interpreter.
        ("python train.py", "train.py"),
        ("python3 train.py --lr 0.1", "train.py"),
        ("/home/ada/.venv/bin/python3.12 -u ./src/train.py", "train.py"),
        ("python -W ignore -X dev train.py", "train.py"),
        ("python -E train.py", "train.py"),
        ("python -- train.py", "train.py"),
        ("pypy3 bench.py", "bench.py"),
        ("bash run.sh 3", "run.sh"),
        ("node app.js", "app.js"),
        # A module, code given inline, nothing at all.
        ("python -m pkg.train --epochs 3", "pkg.train"),
        ("python -mtimeit 1", "timeit"),
        ("python -c 'print(1)'", "python"),
        ("python", "python"),
        ("perl -e 1", "perl"),
        # sh -c: its command's first word (past an interpreter there too).
        ("sh -c 'make all'", "make"),
        # A pipeline or a list: its first command (never an operator).
        ("sh -c 'env | grep -E \"A|B\" | sort'", "env"),
        ("bash -c 'python train.py --lr 1e-3 2>&1 | tee log'", "train.py"),
        ("sh -c 'cd /data && python eval.py'", "eval.py"),
        ("bash -c 'conda activate torch; torchrun train.py'", "train.py"),
        ("sh -c 'cd /data'", "cd"),
        ("sh -c 'true;false'", "true"),
        ("bash -lc 'python train.py --lr 1'", "train.py"),
        ("bash -o pipefail -c 'exec ./serve --port 80'", "serve"),
        ("sh -c 'unbalanced \"quote'", "unbalanced"),
        # Launchers and environments, and their options.
        ("env CUDA_VISIBLE_DEVICES=0 python train.py", "train.py"),
        ("/usr/bin/env -u HOME python3 x.py", "x.py"),
        ("OMP_NUM_THREADS=4 python train.py", "train.py"),
        ("torchrun --nproc-per-node 2 train.py --lr 1", "train.py"),
        ("torchrun --standalone --nproc_per_node=4 train.py", "train.py"),
        ("python -m torch.distributed.run --nproc_per_node 2 train.py", "train.py"),
        ("accelerate launch --config_file configs/a.yaml train.py", "train.py"),
        ("deepspeed --num_gpus 2 train.py --deepspeed ds.json", "train.py"),
        ("uv run --with numpy python train.py", "train.py"),
        ("uv run train.py", "train.py"),
        ("conda run -n torch python x.py", "x.py"),
        ("nice -n 10 nohup python x.py", "x.py"),
        ("time -p python x.py", "x.py"),
        ("timeout -s KILL 10m python x.py", "x.py"),
        ("taskset -c 0-3 python x.py", "x.py"),
        ("srun -p gpu python x.py", "x.py"),
        ("srun --pty mytool", "mytool"),
        ("mpirun -np 4 python x.py", "x.py"),
        # A program that is none of those is named itself, as before.
        ("./train", "train"),
        ("sleep 100", "sleep"),
        ("/opt/tools/bin/trainer --config a.yaml", "trainer"),
        # A launcher with nothing to run is named itself.
        ("env", "env"),
        ("uv sync", "uv"),
    ],
)
def test_program_name(command, name):
    assert program_name(shlex.split(command)) == name


def test_no_command_has_no_name():
    assert program_name([]) == "" and program_name(()) == ""


def test_a_stored_command_is_named_alike():
    # The queue file holds the command as JSON: history and usage name old rows this way.
    assert program_name_of_json(json.dumps(["python", "train.py"])) == "train.py"
    assert program_name_of_json("not json") == program_name_of_json('{"a": 1}') == ""


def test_display_name_is_the_name_or_else_the_program():
    job = Job(id=1, command=("python", "train.py", "--lr", "1"), cwd="/", uid=1, user="u")
    assert job.display_name == "train.py"
    named = Job(id=2, command=("python", "train.py"), cwd="/", uid=1, user="u", name="finetune")
    assert named.display_name == "finetune"


def test_history_finds_runs_by_program_newest_first_across_windows(tmp_path, monkeypatch):
    # `gpusched history train.py`, as the daemon answers it over several turns of its loop,
    # on rows as any gpusched version wrote them: the name is derived from the command.
    commands = [
        ("python", "train.py", "--lr", "1"),
        ("torchrun", "--standalone", "train.py"),
        ("python", "eval.py"),
        ("sh", "-c", "train.py"),
        ("python", "train.py"),
    ]
    store = Store(tmp_path / "queue.db")
    with store.write():
        store.insert(
            Job(
                id=0,
                command=commands[n % 5],
                cwd="/",
                uid=1000 + (n % 7 == 0),
                user="u",
                request=Request(gpus=1),
                name="train.py" if n % 11 == 0 else "",
                job_key=job_key("train.py" if n % 11 == 0 else "", commands[n % 5]),
                state=JobState.SUCCEEDED,
                submitted_at=n,
                started_at=n,
                ended_at=n + 1,
            )
            for n in range(300)
        )
    monkeypatch.setattr(gpumemory, "WINDOW_ROWS", 7)  # many windows, however few rows
    state = SimpleNamespace(store=store, inventory=Inventory())
    setup = SimpleNamespace(settings=load_settings(str(tmp_path / "none.toml"), environ={}))
    want = [
        job_id
        for job_id in range(300, 0, -1)
        if (job_id - 1) % 7 and ((job_id - 1) % 11 == 0 or (job_id - 1) % 5 in (0, 1, 3, 4))
    ]
    for count in (1, 20, 300):
        report = gpumemory.HistoryReport(state, setup, 1000, "train.py", count)
        while (result := report.step()) is None:
            pass
        assert [run["id"] for run in result["runs"]] == want[:count]
    store.close()
