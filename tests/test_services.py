"""`gpusched service`: replicas as jobs with their own $PORT behind a real HAProxy, on
simulated GPUs; each balance spreads requests as it should; a killed replica costs no
request once it is out, and is replaced."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, wait_until
from gpusched.cli.commands import service_cmds
from gpusched.client.connection import Client
from gpusched.client.paths import resolve_paths
from gpusched.core.errors import UsageError
from services_util import (
    PREDICT,
    SERVE,
    TINY,
    Traffic,
    ask,
    create,
    needs_haproxy,
    needs_torch,
    show,
    wait_ready,
    who_answers,
)


@needs_haproxy
@needs_torch
def test_replicas_are_jobs_with_their_own_port_behind_the_front_door(home):
    created = create(
        home, "web", "--replicas", "2", "--gpus", "1", "--health", "/healthz", command=SERVE
    )
    assert created["wanted"] == 2 and created["listen"].startswith("127.0.0.1:")
    shown = wait_ready(home, "web", 2)
    ports = [r["port"] for r in shown["replicas"]]
    assert len(set(ports)) == 2
    jobs = {j["id"]: j for j in home.jobs()}
    for replica in shown["replicas"]:
        job = jobs[replica["job_id"]]
        assert job["state"] == "running" and job["name"] == "web" and len(job["gpu_indices"]) == 1
        # Each replica listens on the $PORT gpusched gave it, and answers directly too.
        status, body = ask(f"127.0.0.1:{replica['port']}", body=PREDICT)
        assert status == 200 and len(json.loads(body)["output"]) == 10
    for _ in range(6):
        status, body = ask(created["listen"], body=PREDICT)
        assert status == 200, body
    listed = json.loads(home.run("service", "ls", "--json").stdout)
    assert [s["name"] for s in listed] == ["web"]
    text = home.run("service", "show", "web").stdout
    assert "2 ready of 2 wanted" in text and "health /healthz" in text
    # Scale down: one replica drained and cancelled; scale up again: a new job.
    home.run("service", "scale", "web", "1")
    wait_ready(home, "web", 1)
    home.run("service", "delete", "web")
    wait_until(
        lambda: not [j for j in home.jobs() if j["state"] in ("pending", "running")],
        "the replicas to end",
    )
    assert home.run("service", "show", "web", check=False).returncode == 1


@needs_haproxy
def test_round_robin_gives_each_replica_its_turn(home):
    created = create(home, "rr", "--replicas", "3")
    shown = wait_ready(home, "rr", 3)
    counts = who_answers(created["listen"], 30)
    assert sorted(counts) == sorted(str(r["job_id"]) for r in shown["replicas"])
    assert set(counts.values()) == {10}, counts


@needs_haproxy
def test_weighted_sends_requests_in_the_ratio_of_the_weights(home):
    created = create(home, "wt", "--replicas", "2", "--balance", "weighted", "--weights", "3,1")
    shown = wait_ready(home, "wt", 2)
    by_slot = {}
    counts = who_answers(created["listen"], 40)
    for replica in shown["replicas"]:
        by_slot[replica["weight"]] = counts[str(replica["job_id"])]
    assert set(by_slot) == {3, 1}
    assert 26 <= by_slot[3] <= 34 and by_slot[3] + by_slot[1] == 40, by_slot


@needs_haproxy
def test_least_connections_sends_fewer_requests_to_a_slow_replica(home):
    created = create(
        home,
        "lc",
        "--replicas",
        "2",
        "--balance",
        "leastconn",
        "--env",
        "SLOW_SLOT=0",
        "--env",
        "DELAY_S=0.3",
    )
    shown = wait_ready(home, "lc", 2)
    with Traffic(created["listen"], clients=4, path="/", body=None) as traffic:
        wait_until(lambda: traffic.served() >= 40, "40 requests served")
    assert not traffic.failures()
    after = {r["job_id"]: r["requests"] for r in show(home, "lc")["replicas"]}
    slow, fast = sorted(after.values())
    assert slow * 2 < fast, after
    assert len(shown["replicas"]) == 2


@needs_haproxy
def test_a_replica_slow_to_answer_its_health_check_stays_in_rotation(home):
    # As on a busy machine: each check takes 0.8 s, over the 300 ms between checks.
    created = create(
        home, "slowcheck", "--replicas", "1", "--health", "/healthz", "--env", "HEALTH_DELAY_S=0.8"
    )
    wait_ready(home, "slowcheck", 1)
    with Traffic(created["listen"], clients=1, path="/", body=None) as traffic:
        wait_until(lambda: traffic.served() >= 20, "20 requests served")
    assert not traffic.failures(), traffic.failures()[:5]


@needs_haproxy
def test_a_killed_replica_costs_no_request_once_removed_and_is_replaced(home):
    created = create(home, "kill", "--replicas", "2", "--health", "/healthz")
    shown = wait_ready(home, "kill", 2)
    victim = shown["replicas"][0]
    with Traffic(created["listen"], clients=2, path="/", body=None) as traffic:
        wait_until(lambda: traffic.served() >= 20, "traffic flowing")
        # The replica's server: by its port, which no other replica anywhere has.
        server = next(
            p
            for p in home.processes()
            if (p.environ() or {}).get("PORT") == str(victim["port"])
            and "svcserver" in " ".join(p.cmdline())
        )
        os.kill(server.pid, signal.SIGKILL)
        # Out of the front door: its job ended and its server removed.
        wait_until(
            lambda: victim["job_id"] not in [r["job_id"] for r in show(home, "kill")["replicas"]],
            "the killed replica to leave the front door",
        )
        removed_at = time.monotonic()
        replaced = wait_ready(home, "kill", 2)
        served_before = traffic.served()
        wait_until(lambda: traffic.served() >= served_before + 20, "more traffic")
    assert victim["job_id"] not in [r["job_id"] for r in replaced["replicas"]]
    assert not traffic.failures(after=removed_at), traffic.failures(after=removed_at)[:5]
    assert len(traffic.failures()) <= 2, traffic.failures()  # those in flight at the kill


def test_without_haproxy_create_says_how_to_install_it(home):
    home.write_config('[services]\nhaproxy = "/nonexistent/haproxy"\n')
    proc = home.run("service", "create", "x", "--", "true", check=False)
    assert proc.returncode == 1
    assert (
        proc.stderr.startswith("Error: services need HAProxy")
        and "apt-get install haproxy" in proc.stderr
        and len(proc.stderr.splitlines()) == 1
    ), proc.stderr
    assert not list(home.jobs())


def test_a_bad_balance_lists_the_choices(home):
    proc = home.run("service", "create", "x", "--balance", "random", "--", "true", check=False)
    assert proc.returncode == 2 and "roundrobin, leastconn, weighted" in proc.stderr


@needs_haproxy
def test_a_services_environment_is_checked_as_a_submits_on_create_and_update(home, tmp_path):
    # Through the protocol, bypassing the client: before, {"A=B": "x"} was taken, and each
    # replica's start killed the job supervisor (the unrelated job below was then lost).
    running = home.submit(
        "--gpus", "0", "--", "sh", "-c", f"until [ -e {tmp_path / 'go'} ]; do sleep 0.05; done"
    )
    home.wait_state(running, "running")
    cli = Client(resolve_paths(home.env), autostart=False)
    job = {"command": TINY, "name": "web", "gpus": 0}
    for env in ({"A=B": "x"}, {"": "x"}, {"A": "x\0y"}):
        with pytest.raises(UsageError, match=r"spec\.env|environment variable"):
            cli.call(
                "service", action="create", name="web", spec={"job": job, "env": env, "cwd": "/"}
            )
    assert cli.call("service", action="list")["services"] == []
    create(home, "web", "--replicas", "0")
    with pytest.raises(UsageError, match=r"spec\.env: 'A=B' is not an environment variable"):
        cli.call(
            "service",
            action="update",
            name="web",
            spec={"job": job, "env": {"A=B": "x"}, "cwd": "/"},
        )
    assert show(home, "web")["generation"] == 1
    (tmp_path / "go").touch()
    assert home.wait_state(running, "succeeded", "failed", "lost")["state"] == "succeeded"
    home.run("service", "delete", "web")


def test_the_docs_durations_of_a_service_are_taken():
    # docs/services.md's own example: --target-latency 200ms, --window 30s, --cooldown 60s.
    usage = (REPO / "docs" / "services.md").read_text()
    given = dict(re.findall(r"\[(--target-latency|--window|--cooldown) (\S+)\]", usage))
    assert given == {"--target-latency": "200ms", "--window": "30s", "--cooldown": "60s"}
    seconds = {option: service_cmds._seconds(text, option) for option, text in given.items()}
    assert seconds == {"--target-latency": 0.2, "--window": 30.0, "--cooldown": 60.0}


@needs_haproxy
@needs_torch
def test_load_grows_replicas_to_max_and_quiet_gives_the_gpu_back_to_a_batch_job(make_home):
    home = make_home("2x80GiB")
    # Simulated GPUs show a fixed utilization per job: low here, so that load decides.
    created = create(
        home,
        "auto",
        "--replicas",
        "1:2",
        "--gpus",
        "1",
        "--health",
        "/healthz",
        "--env",
        "GPUSCHED_SIM_UTIL_PCT=5",
        "--target-in-flight",
        "1",
        "--window",
        "3s",
        "--cooldown",
        "3s",
        command=SERVE,
    )
    wait_ready(home, "auto", 1)
    load = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "jobs" / "loadgen.py"),
            "--url",
            f"http://{created['listen']}",
            "--clients",
            "6",
            "--duration-s",
            "300",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        grown = wait_ready(home, "auto", 2, timeout=120)
    finally:
        load.kill()
        load.wait()
    assert grown["wanted"] == 2 and grown["requests_total"] > 0
    # Both GPUs serve now: a batch job waits for one.
    batch = home.submit("--gpus", "1", "--", "sleep", "0")
    assert home.show(batch)["state"] == "pending"
    # Quiet: back to MIN; the replica let go is drained and its GPU goes to the batch job.
    shrunk = wait_ready(home, "auto", 1, timeout=120)
    assert shrunk["wanted"] == 1
    home.wait_state(batch, "succeeded")
    events = " ".join(e["event"] for e in shrunk["events"])
    assert "scaled 1 -> 2 replicas (requests in flight over target)" in events
    assert "scaled 2 -> 1 replicas (load below target)" in events


@needs_haproxy
def test_a_replica_that_cannot_start_is_retried_ever_later_not_in_a_loop(home):
    create(home, "broken", "--replicas", "1", command=["sh", "-c", "exit 3"])

    def events():
        return [
            e["event"]
            for e in show(home, "broken")["events"]
            if "before passing a health check" in e["event"]
        ]

    found = wait_until(lambda: len(e := events()) >= 2 and e, "two failed replicas")
    assert "(1 in a row); the next one in 2s" in found[0]
    assert "(2 in a row); the next one in 4s" in found[1]
    failed = [j for j in home.jobs() if j["name"] == "broken" and j["state"] == "failed"]
    assert failed and all(j["exit_code"] == 3 for j in failed)


@needs_haproxy
def test_a_replica_the_gpus_cannot_take_now_waits_with_its_reason(make_home):
    home = make_home("1x80GiB")
    create(home, "one", "--replicas", "1", "--gpus", "1")
    wait_ready(home, "one", 1)
    home.run("service", "scale", "one", "2")
    # Submitted, it reads "waiting to be placed" until the next scheduling pass explains it.
    waiting = wait_until(
        lambda: [
            r
            for r in show(home, "one")["replicas"]
            if r["state"] == "pending"
            and r["pending_reason"]
            and r["pending_reason"] != "waiting to be placed"
        ],
        "the second replica to wait with its reason",
    )
    assert "GPU" in waiting[0]["pending_reason"]
    assert "pending" in home.run("service", "show", "one").stdout


@needs_haproxy
def test_weighted_without_weights_follows_each_replicas_gpu(make_home):
    home = make_home("1xH100-80GiB,1xA100-40GiB")
    created = create(home, "gpuw", "--replicas", "2", "--gpus", "1", "--balance", "weighted")
    shown = wait_ready(home, "gpuw", 2)
    weights = {r["gpu_indices"][0]: r["weight"] for r in shown["replicas"]}
    assert weights == {0: 80, 1: 40}
    counts = who_answers(created["listen"], 30)
    by_gpu = {r["gpu_indices"][0]: counts[str(r["job_id"])] for r in shown["replicas"]}
    assert 17 <= by_gpu[0] <= 23 and by_gpu[0] + by_gpu[1] == 30, by_gpu
