"""One job name everywhere, as a user meets it: `python train.py` submitted from a
virtualenv, through the installed console script and a real daemon, is train.py in ls,
show, top, history and usage alike; a --name wins everywhere."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from conftest import Home

SYSTEM_PATH = "/usr/bin:/bin"


def test_python_train_py_is_train_py_everywhere(home: Home):
    (home.path / "train.py").write_text("print('trained')\n")
    # The user's shell: the virtualenv's bin first, so `python` is its python.
    env = home.user_env(path=f"{Path(sys.executable).parent}:{SYSTEM_PATH}")

    def gpusched(*args: str) -> str:
        return home.script(*args, env=env).stdout

    ran = int(
        gpusched("submit", "--gpus", "1", "--", "python", "train.py", "--lr", "0.1").split()[0]
    )
    named = int(gpusched("submit", "--name", "finetune", "--", "python", "train.py").split()[0])
    for job_id in (ran, named):
        assert home.wait_state(job_id, "succeeded", "failed")["state"] == "succeeded", home.show(
            job_id
        )["end_reason"]
    waiting = int(gpusched("submit", "--hold", "--", "python", "train.py").split()[0])

    # show and ls (--json and the table)
    assert home.show(ran)["name"] == "train.py" and home.show(named)["name"] == "finetune"
    names = {job["id"]: job["name"] for job in home.jobs()}
    assert names == {ran: "train.py", named: "finetune", waiting: "train.py"}
    assert re.search(rf"^{waiting} +\S+ +train\.py +pending", gpusched("ls"), re.M)
    assert [j["id"] for j in home.json("ls", "--all", "--name", "train.py")] == [ran, waiting]

    # top shows the pending one by the same name
    assert re.search(rf"│ +{waiting} +\S+ +train\.py", home.run("top", "--once").stdout)

    # history finds by that name what ls shows (and by the command, as before)
    report = home.json("history", "train.py")
    assert [run["id"] for run in report["runs"]] == [ran]
    assert report["estimate"]["key"] == "python train.py --lr 0.1"
    assert [run["id"] for run in home.json("history", "finetune")["runs"]] == [named]
    by_command = home.json("history", "--", "python", "train.py", "--lr", "0.1")
    assert [run["id"] for run in by_command["runs"]] == [ran]
    listed = gpusched("history", "train.py")
    assert re.search(rf"^{ran} +succeeded", listed, re.M)
    assert "--gpu-mem auto for 'python train.py --lr 0.1': " in listed

    # usage --by name groups under the same names
    groups = {g["key"]: g["jobs"] for g in home.json("usage", "--by", "name")["groups"]}
    assert groups == {"train.py": 1, "finetune": 1}
    home.run("cancel", str(waiting))
