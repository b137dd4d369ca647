"""`service update` and `service scale` as a user meets them: an update keeps what it does
not change, rolls out one replica at a time even with every GPU held, and says where it
stands; a manual scale holds the autoscaler off for its cool-down; a replica that dies is
an event."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO, wait_until
from gpusched.core import services as model
from services_util import TINY, Traffic, create, needs_haproxy, needs_torch, show, wait_ready


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _update(home, name: str, *args: str) -> dict:
    return json.loads(home.run("service", "update", name, "--json", *args).stdout)


@needs_haproxy
def test_an_update_with_only_a_new_command_keeps_the_services_gpus(home):
    create(home, "keep", "--replicas", "1", "--gpus", "1", "--env", "KEPT=1")
    wait_ready(home, "keep", 1)
    # The docs' own example: a new command, nothing else.
    updated = _update(home, "keep", "--", *TINY, "--v2")
    assert updated["job"]["gpus"] == 1 and updated["job"]["command"][-1] == "--v2"
    after = wait_ready(home, "keep", 1, generation=2)
    replica = home.show(after["replicas"][0]["job_id"])
    assert replica["state"] == "running" and len(replica["gpu_indices"]) == 1, replica
    env = home.run("env", str(replica["id"])).stdout
    assert "KEPT=1" in env
    # Job options without a command change those alone: the command stays.
    _update(home, "keep", "--gpus", "2")
    again = wait_ready(home, "keep", 1, generation=3)
    replica = home.show(again["replicas"][0]["job_id"])
    assert len(replica["gpu_indices"]) == 2 and replica["command"][-1] == "--v2", replica


@needs_haproxy
def test_an_update_with_every_gpu_held_replaces_one_replica_at_a_time(make_home):
    home = make_home("2x80GiB")
    created = create(home, "full", "--replicas", "2", "--gpus", "1", "--health", "/healthz")
    before = wait_ready(home, "full", 2)

    def rolled_out():
        shown = show(home, "full")
        done = [r for r in shown["replicas"] if r["generation"] == 2 and r["door"] == "ready"]
        return shown if len(done) == 2 and len(shown["replicas"]) == 2 else None

    with Traffic(created["listen"], clients=1, path="/", body=None) as traffic:
        wait_until(lambda: traffic.served() >= 5, "traffic flowing")
        updated = _update(home, "full", "--", *TINY, "--v2")
        after = wait_until(rolled_out, "both replicas replaced", timeout=120)
    assert not {r["job_id"] for r in before["replicas"]} & {r["job_id"] for r in after["replicas"]}
    # `service show` said where the update stood, and says nothing once it is done.
    assert updated["updating"].startswith("replica 0 of 2 replaced; "), updated
    finished = wait_until(
        lambda: (s := show(home, "full"))["updating"] == "" and s, "the update to finish"
    )
    events = " ".join(e["event"] for e in finished["events"])
    assert events.count("beside the old ones") == 2 and "update 2 done" in events, events
    # One replica was always serving: no request was lost.
    assert not traffic.failures(), traffic.failures()[:5]


@needs_haproxy
def test_a_manual_scale_holds_the_autoscaler_off_for_its_cool_down(home):
    create(home, "hand", "--replicas", "1:3", "--window", "1s", "--cooldown", "1h")
    wait_ready(home, "hand", 1)
    home.run("service", "scale", "hand", "3")
    # Before, "load below target" took it back down within a second or two.
    shown = wait_until(
        lambda: (s := show(home, "hand"))["wanted"] != 3 or (s["running"] == 3 and s),
        "3 replicas or a scale-down",
    )
    assert shown["wanted"] == 3, shown["events"]
    assert shown["autoscale_resumes_at"] > time.time() + 3000
    assert "autoscaling resumes at" in home.run("service", "show", "hand").stdout


def test_the_autoscaler_resumes_once_the_manual_scales_cool_down_is_over():
    rule = model.Autoscale(target_in_flight=2.0, window_s=10.0, cooldown_s=60.0)
    service = model.Service(
        name="web",
        uid=1,
        user="u",
        job={},
        env={},
        cwd="/",
        min_replicas=1,
        max_replicas=3,
        wanted=3,
        autoscale=rule,
        autoscale_resumes_at=1060.0,
    )
    quiet = [model.LoadSample(1000.0 + i, 0, 3) for i in range(61)]
    assert model.decide(service, quiet, 1059.0, 0.0, 720) == (3, "")
    assert model.decide(service, quiet, 1060.0, 0.0, 720) == (2, "load below target")


@needs_haproxy
def test_a_replica_that_dies_is_an_event_of_its_service(home):
    create(home, "mortal", "--replicas", "1")
    replica = wait_ready(home, "mortal", 1)["replicas"][0]
    server = next(
        p
        for p in home.processes()
        if (p.environ() or {}).get("PORT") == str(replica["port"])
        and "svcserver" in " ".join(p.cmdline())
    )
    os.kill(server.pid, signal.SIGKILL)
    words = f"replica 0 (job {replica['job_id']}) died: killed by SIGKILL"
    wait_until(
        lambda: words in home.run("service", "show", "mortal").stdout, "the death in `service show`"
    )
    wait_ready(home, "mortal", 1)  # and replaced


def test_where_an_update_stands_in_words():
    def replica(job_id, generation, state="running", door="ready", why=""):
        return {
            "job_id": job_id,
            "generation": generation,
            "state": state,
            "door": door,
            "pending_reason": why,
        }

    assert model.rollout_words(2, 2, [replica(1, 2), replica(2, 2)]) == ""
    assert (
        model.rollout_words(
            2, 2, [replica(1, 1), replica(2, 1), replica(3, 2, "pending", "-", "needs 1 whole GPU")]
        )
        == "replica 0 of 2 replaced; replica job 3 waits: needs 1 whole GPU"
    )
    assert (
        model.rollout_words(
            2, 2, [replica(1, 1, door="draining"), replica(2, 1), replica(3, 2, "pending", "-")]
        )
        == "replica 0 of 2 replaced; draining old replica job 1"
    )
    assert (
        model.rollout_words(2, 2, [replica(2, 1), replica(3, 2), replica(4, 2, door="checking")])
        == "replica 1 of 2 replaced; replica job 4 waits for its health check"
    )


def test_an_update_merges_over_the_stored_job():
    stored = {
        "command": ["a"],
        "gpus": 1,
        "gpu_mem_bytes": None,
        "constraints": {"gpu_type": "H100", "gpu_ids": []},
    }
    assert model.merged_job(stored, {"command": ["b"]}) == {**stored, "command": ["b"]}
    assert model.merged_job(stored, {"constraints": {"gpu_ids": [1]}})["constraints"] == {
        "gpu_type": "H100",
        "gpu_ids": [1],
    }
    assert (
        model.merged_job({**stored, "gpus": 0, "constraints": {}}, {"gpu_mem_bytes": 2**30})["gpus"]
        == 1
    )
    assert "constraints" not in model.merged_job(stored, {"gpus": 0})


def _worked_example() -> list[tuple[list[str], str]]:
    """docs/services.md's worked example: each command line of its sh blocks, as words
    (to know it by) and as written (to run)."""
    text = (REPO / "docs" / "services.md").read_text()
    section = text.split("## A worked example", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [(words, line) for line in lines if (words := shlex.split(line, comments=True))]


@needs_haproxy
@needs_torch
def test_the_docs_worked_example_behaves_as_written(make_home, tmp_path):
    commands = _worked_example()
    exports = dict(w[1].split("=", 1) for w, _ in commands if w[0] == "export")
    home = make_home(exports.pop("GPUSCHED_SIMULATE"))
    # A user's shell: the exports, and `python` and `gpusched` those of this virtualenv.
    # Port 8080 may be taken on a shared machine: another free one stands in for it.
    env = {
        **home.env,
        **exports,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    }
    port = str(free_port())
    by_start = {" ".join(w[:3]) if w[0] == "gpusched" else w[0]: line for w, line in commands}

    def run(line: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            ["bash", "-c", line.replace("8080", port)],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, (line, proc.stdout, proc.stderr)
        return proc

    run(by_start["gpusched daemon start"])
    created = run(by_start["gpusched service create"]).stdout
    assert "0 ready of 1 wanted (min 1, max 2; now allowed 1-2)" in created, created
    wait_ready(home, "chat", 1)
    answer = json.loads(run(by_start["curl"]).stdout)
    assert len(answer["output"]) == 10
    # The load, for a minute, as written; on a machine too busy for it to fill a window
    # (its clients starved beside other work), the same again, at most twice more.
    for _ in range(3):
        load = run(by_start["python"])
        grown = show(home, "chat")
        if grown["wanted"] == 2:
            break
    assert grown["wanted"] == 2 and len(grown["replicas"]) == 2, (load.stdout, grown)
    assert "scaled 1 -> 2 replicas (requests in flight over target)" in " ".join(
        e["event"] for e in grown["events"]
    )
    # A batch job waits for a GPU, and gets one once the quiet scales the service down.
    (tmp_path / "train.py").write_text("print('trained')\n")
    run(by_start["gpusched submit --gpus"], tmp_path)
    batch = next(j for j in home.jobs() if j["command"][-1] == "train.py")
    assert batch["state"] == "pending", batch
    assert home.wait_state(batch["id"], "succeeded", timeout=120)["state"] == "succeeded"
    shrunk = show(home, "chat")
    assert shrunk["wanted"] == 1
    assert "scaled 2 -> 1 replicas (load below target)" in " ".join(
        e["event"] for e in shrunk["events"]
    )
    # The last block: show, ls, scale, update and delete, each as written.
    last = [line for _, line in commands]
    for line in last[last.index(by_start["gpusched service show"]) :]:
        run(line)
    assert home.run("service", "show", "chat", check=False).returncode == 1  # deleted
