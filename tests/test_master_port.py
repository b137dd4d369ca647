"""MASTER_PORT: a port given to one job is kept from everyone else until the job ends."""

from __future__ import annotations

import sys

from conftest import wait_until

# Listens on the job's MASTER_PORT the way torch's rendezvous store does (SO_REUSEADDR),
# but only once the test says so: the port has been given out, not bound yet.
RENDEZVOUS = """
import os, socket, time
while not os.path.exists("go"):
    time.sleep(0.05)
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("", int(os.environ["MASTER_PORT"])))
server.listen()
open("listening", "w").close()
while not os.path.exists("end"):
    time.sleep(0.05)
"""
# Away from the default range's low end, where other tests' jobs get their ports.
PORTS = "[jobs]\nmaster_port_min = 29940\nmaster_port_max = 29949\n"


def test_two_daemons_never_give_one_port_to_two_jobs(make_home):
    """Two users' daemons on one box: the second must not give out the port that the
    first gave its job seconds ago, before that job has bound it."""
    homes = [make_home(name="first"), make_home(name="second")]
    jobs = []
    for home in homes:
        home.write_config(PORTS)
        jobs.append(home.submit("--gpus", "1", "--", sys.executable, "-c", RENDEZVOUS))
        home.wait_state(jobs[-1], "running")
    ports = [home.show(job_id)["master_port"] for home, job_id in zip(homes, jobs)]
    assert ports[0] != ports[1]
    for home in homes:
        (home.path / "go").touch()
    for home, job_id in zip(homes, jobs):
        wait_until(
            lambda: (home.path / "listening").exists() or home.show(job_id)["state"] != "running",  # noqa: B023 - called within this turn of the loop
            f"job {job_id} to listen on its port",
        )
        (home.path / "end").touch()
        job = home.wait_state(job_id, "succeeded", "failed")
        assert job["state"] == "succeeded", home.run("logs", "--stderr", str(job_id)).stdout
