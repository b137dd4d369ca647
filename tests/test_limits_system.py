"""What other users see of a job whose command is hidden (issue 14, point 12): in system
mode with two real users, through the real CLI."""

from __future__ import annotations

import json
import os

SECRETS = ("secret-sweep", "hidden-place")


def test_others_see_no_name_cwd_logs_or_submitter_of_a_hidden_job(system, users):
    alice, bob = users
    place = os.path.join(alice.home, "hidden-place")
    system.run_as(alice, "--version")  # the home exists; make the directory as alice
    os.makedirs(place)
    os.chown(place, alice.uid, alice.gid)
    job_id = system.submit(
        alice, "--hold", "--name", "secret-sweep", "--cwd", place, "--", "sleep", "300"
    )
    seen = {
        "ls": {j["id"]: j for j in system.json_as(bob, "ls")}[job_id],
        "ls --all": {j["id"]: j for j in system.json_as(bob, "ls", "--all")}[job_id],
        "show": system.json_as(bob, "show", str(job_id)),
    }
    for how, job in seen.items():
        assert job["command"] == ["(hidden)"] and job["name"] == "", how
        assert job["cwd"] == job["stdout_path"] == job["stderr_path"] == "(hidden)", how
        assert job["submit_pid"] is None, how
        assert not any(s in json.dumps(job) for s in SECRETS), how
    table = system.run_as(bob, "ls", "--format", "jobid,name,workdir,command").stdout
    top = system.run_as(bob, "top", "--once").stdout
    for text in (table, top):
        assert not any(s in text for s in SECRETS), text
    # Its owner sees it all.
    own = system.json_as(alice, "show", str(job_id))
    assert (own["name"], own["cwd"]) == ("secret-sweep", place) and own["submit_pid"]
