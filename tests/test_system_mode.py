"""System mode: one root daemon for real users made with useradd, driven through the real CLI as them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
from pathlib import Path

import psutil
import pytest

from conftest import executable, find_shim, wait_until
from systemroot import SystemRoot, pytestmark  # noqa: F401 - the module's marks


def _run_uids(system: SystemRoot, job_id: int) -> tuple[int, set[int]] | None:
    """(the shim's uid, the real uids of the processes under it), found by the shim's
    record in the job's run file."""
    found = find_shim(system.path / "var/lib/gpusched/jobs", job_id)
    if found is None:
        return None
    try:
        proc = psutil.Process(found[0])
        return proc.uids().real, {c.uids().real for c in proc.children(recursive=True)}
    except psutil.Error:
        return None


# -- the daemon and its files --------------------------------------------------------------


def test_system_daemon_layout_and_status_says_which(system, users):
    alice, _ = users
    run_dir = system.socket.parent
    assert run_dir.stat().st_uid == 0 and stat.S_IMODE(run_dir.stat().st_mode) == 0o755
    assert stat.S_IMODE(system.socket.stat().st_mode) == 0o666
    state = system.path / "var/lib/gpusched"
    assert state.stat().st_uid == 0 and stat.S_IMODE(state.stat().st_mode) == 0o700
    out = system.run_as(alice, "daemon", "status").stdout
    assert f"using the system daemon at {system.socket}" in out
    status = json.loads(system.run_as(alice, "daemon", "status", "--json").stdout)
    assert status["daemon"] == "system" and status["running"] is True


def test_job_runs_as_its_submitter_with_private_logs(system, users):
    alice, bob = users
    job_id = system.submit(alice, "--", "sh", "-c", "id -u; id -g; id -G; echo oops >&2")
    job = system.wait_state(job_id, "succeeded", "failed")
    assert job["state"] == "succeeded", job["end_reason"]
    uid, gid, groups = system.run_as(alice, "logs", str(job_id)).stdout.splitlines()
    assert (int(uid), int(gid)) == (alice.uid, alice.gid)
    assert sorted(map(int, groups.split())) == alice.groups
    assert len(alice.groups) >= 2  # the extra group is there: supplementary groups were set

    log_dir = Path(job["stdout_path"]).parent
    assert log_dir == system.path / "var/log/gpusched" / alice.name
    for path in (log_dir, Path(job["stdout_path"]), Path(job["stderr_path"])):
        info = path.lstat()
        assert (info.st_uid, info.st_gid) == (alice.uid, alice.gid), path
        assert not info.st_mode & 0o077, f"{path} is readable by others"
    assert system.run_as(alice, "logs", "--stderr", str(job_id)).stdout == "oops\n"
    peek = subprocess.run(
        [
            "setpriv",
            f"--reuid={bob.uid}",
            f"--regid={bob.gid}",
            "--init-groups",
            "cat",
            job["stdout_path"],
        ],
        capture_output=True,
    )
    assert peek.returncode != 0 and b"Permission denied" in peek.stderr


def test_job_whose_cwd_its_user_cannot_enter_fails_and_runs_nothing(system, users):
    alice, bob = users
    secret = system.path / "secret"
    secret.mkdir(mode=0o700)  # root's: alice may see it exists, not enter it
    job_id = system.submit(alice, "--cwd", str(secret), "--", "sh", "-c", "touch entered")
    job = system.wait_state(job_id, "succeeded", "failed")
    assert job["state"] == "failed"
    why = f"cannot start: working directory {secret} cannot be entered (permission denied)"
    assert job["end_reason"] == why
    assert not (secret / "entered").exists()  # root never ran it there on alice's behalf
    note = system.run_as(alice, "logs", "--stderr", str(job_id)).stdout
    assert note == f"gpusched: {why}\n"
    # The reason names the program: others see that it failed, not with what.
    assert system.json_as(bob, "show", str(job_id))["end_reason"] == "cannot start: (hidden)"


def test_a_bare_command_is_found_on_the_submitters_path_as_the_submitter(system, users):
    alice, _ = users
    # First on her PATH, a directory only root may enter, with a program of the same
    # name: the lookup runs after the drop to alice, so it passes over it as her shell does.
    roots_bin, her_bin = system.path / "root-bin", system.path / "alice-bin"
    executable(roots_bin / "hello-tool", "#!/bin/sh\necho root\n")
    roots_bin.chmod(0o700)
    executable(her_bin / "hello-tool", '#!/bin/sh\necho "$0 as $(id -u)"\n')
    path = f"{roots_bin}:{her_bin}:/usr/bin:/bin"
    job_id = system.submit(alice, "--", "hello-tool", extra_env={"PATH": path})
    job = system.wait_state(job_id, "succeeded", "failed")
    assert job["state"] == "succeeded", job["end_reason"]
    ran = system.run_as(alice, "logs", str(job_id)).stdout
    assert ran == f"{her_bin}/hello-tool as {alice.uid}\n"
    # A typo says so in words: at `submit --wait`, in `show` and in her stderr log.
    typo = system.run_as(
        alice, "submit", "--wait", "--", "hello-tol", extra_env={"PATH": path}, check=False
    )
    typo_id, why = int(typo.stdout), f"no such command 'hello-tol' in PATH ({path})"
    assert (typo.returncode, typo.stderr) == (127, f"Error: job {typo_id} could not start: {why}\n")
    assert system.show(typo_id)["end_reason"] == f"cannot start: {why}"
    assert system.run_as(alice, "logs", "--stderr", str(typo_id)).stdout == (
        f"gpusched: cannot start: {why}\n"
    )


def test_other_users_cannot_touch_a_job_and_every_denial_is_audited(system, users):
    alice, bob = users
    running = system.submit(alice, "--", "sleep", "300")
    held = system.submit(alice, "--hold", "--", "sleep", "300")
    system.wait_state(running, "running")
    attempts = [
        ("cancel", str(running)),
        ("hold", str(held)),
        ("release", str(held)),
        ("update", str(held), "--priority", "5"),
        ("logs", str(running)),
        ("env", str(running)),
    ]
    for args in attempts:
        proc = system.run_as(bob, *args, check=False)
        assert proc.returncode == 1, args
        assert proc.stderr.startswith(
            f"Error: job {args[1]} belongs to {alice.name}; only they or an admin may"
        ), proc.stderr
    assert system.show(running)["state"] == "running"
    assert system.show(held)["held"] and system.show(held)["priority"] == 0
    entries = system.audit()
    assert [(e["request"], str(e["job"])) for e in entries] == [a[:2] for a in attempts]
    assert all(e["uid"] == bob.uid and e["user"] == bob.name and e["pid"] > 0 for e in entries)
    assert stat.S_IMODE(system.audit_log.stat().st_mode) == 0o600

    # Everyone sees the queue; only the owner (and admins) see the command line.
    seen_by_bob = {j["id"]: j for j in system.json_as(bob, "ls")}
    assert seen_by_bob[running]["user"] == alice.name
    assert seen_by_bob[running]["command"] == ["(hidden)"]
    assert seen_by_bob[running]["name"] == ""
    assert "sleep" not in json.dumps(system.json_as(bob, "show", str(running)))
    assert {j["id"]: j for j in system.json_as(alice, "ls")}[running]["command"] == ["sleep", "300"]

    # Root may do all of it.
    system.run_as(None, "update", str(held), "--priority", "5")
    assert system.show(held)["priority"] == 5
    system.run_as(None, "logs", str(running))
    assert "PATH" in system.json_as(None, "env", str(running))
    system.run_as(None, "cancel", str(running), str(held))
    assert system.wait_state(running, "cancelled")["state"] == "cancelled"
    assert len(system.audit()) == len(attempts)


def test_only_the_owner_or_an_admin_resubmits_and_the_copy_runs_as_the_owner(system, users):
    alice, bob = users
    job_id = system.submit(alice, "--env", "MARK=alices", "--", "sh", "-c", 'echo "$(id -u) $MARK"')
    assert system.wait_state(job_id, "succeeded")["user"] == alice.name
    before = system.json_as(None, "ls", "--all")
    proc = system.run_as(bob, "resubmit", str(job_id), check=False)
    assert proc.returncode == 1
    assert proc.stderr == (
        f"Error: job {job_id} belongs to {alice.name}; only they or an admin may resubmit it\n"
    )
    assert system.json_as(None, "ls", "--all") == before  # nothing queued
    assert [(e["request"], e["job"], e["uid"]) for e in system.audit()] == [
        ("resubmit", job_id, bob.uid)
    ]
    # The owner may, and so may root; either way the copy is alice's job, run as her.
    for who in (alice, None):
        again = int(system.run_as(who, "resubmit", str(job_id)).stdout)
        job = system.wait_state(again, "succeeded", "failed")
        assert (job["state"], job["user"]) == ("succeeded", alice.name)
        assert system.run_as(alice, "logs", str(again)).stdout == f"{alice.uid} alices\n"


def test_ls_filters_select_what_the_caller_may_see(system, users):
    alice, bob = users
    unnamed = system.submit(alice, "--hold", "--", "sleep", "300")  # named after its program
    bobs = system.submit(bob, "--hold", "--name", "mine", "--", "true")

    def ids(who, *args):
        return [j["id"] for j in system.json_as(who, "ls", *args)]

    assert ids(bob, "--user", alice.name) == [unnamed]
    assert ids(bob, "--me") == [bobs]
    assert ids(alice, "--name", "sleep") == [unnamed]
    assert ids(bob, "--name", "sleep") == []  # another user's command stays hidden


def test_users_ld_preload_and_pythonpath_never_run_as_root(system, users, tmp_path):
    alice, _ = users
    if not shutil.which("gcc"):
        pytest.skip("gcc is not installed: cannot build the LD_PRELOAD probe library")
    probe_dir = system.path / "probe"
    probe_dir.mkdir(mode=0o755)
    marker = probe_dir / "marker"
    marker.touch(mode=0o666)
    os.chmod(marker, 0o666)
    source = probe_dir / "probe.c"
    source.write_text(
        "#include <stdio.h>\n#include <unistd.h>\n"
        "__attribute__((constructor)) static void mark(void) {\n"
        f'  FILE *f = fopen("{marker}", "a");\n'
        '  if (f) { fprintf(f, "%d\\n", (int)getuid()); fclose(f); }\n}\n'
    )
    library = probe_dir / "probe.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    (probe_dir / "sitecustomize.py").write_text(
        f"import os\nwith open({str(marker)!r}, 'a') as f:\n    f.write(f'{{os.getuid()}}\\n')\n"
    )
    hostile = {
        "LD_PRELOAD": str(library),
        "PYTHONSTARTUP": str(probe_dir / "sitecustomize.py"),
        "PYTHONPATH": f"{probe_dir}:{system.pythonpath}",
    }

    job_id = system.submit(alice, "--", "sh", "-c", "python3 -c pass || true", extra_env=hostile)
    assert system.wait_state(job_id, "succeeded", "failed")["state"] == "succeeded"
    env = system.json_as(alice, "env", str(job_id))
    assert env["LD_PRELOAD"] == str(library)  # it was captured, and reached the job
    writers = marker.read_text().split()
    assert writers, "the probe never ran: the test would prove nothing"
    assert set(writers) == {str(alice.uid)}, f"the probe ran as uids {set(writers)}"


def test_client_refuses_a_socket_of_another_user(system, users):
    alice, bob = users
    fake_dir, out_dir = system.path / "fake", system.path / "fake-out"
    for path in (fake_dir, out_dir):
        path.mkdir()
        os.chown(path, bob.uid, bob.gid)
    fake_socket, received = fake_dir / "gpusched.sock", out_dir / "received"
    listener = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()\n"
        "import os; os.chmod(sys.argv[1], 0o666)\n"
        "while True:\n"
        "    c, _ = s.accept(); data = b''\n"
        "    while chunk := c.recv(65536): data += chunk\n"
        "    open(sys.argv[2], 'a').write(f'{len(data)}\\n'); c.close()\n"
    )
    fake = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={bob.uid}",
            f"--regid={bob.gid}",
            "--init-groups",
            system.python,
            "-c",
            listener,
            str(fake_socket),
            str(received),
        ],
        start_new_session=True,
        env={"PATH": os.defpath},
    )
    try:
        wait_until(fake_socket.exists, "the planted socket")
        proc = system.run_as(
            alice, "ls", check=False, extra_env={"GPUSCHED_SOCKET": str(fake_socket)}
        )
        assert proc.returncode == 1
        assert proc.stderr.startswith(
            "Error: refusing to talk to the gpusched daemon: its "
            f"socket {fake_socket} belongs to {bob.name}"
        ), proc.stderr
        # Even when the path looks right, the listening process's uid gives it away.
        os.chown(fake_socket, 0, 0)
        os.chown(fake_dir, 0, 0)
        proc = system.run_as(
            alice,
            "submit",
            "--",
            "true",
            check=False,
            extra_env={"GPUSCHED_SOCKET": str(fake_socket)},
        )
        assert proc.returncode == 1
        assert "the process listening on its socket belongs to" in proc.stderr, proc.stderr
        # The line is written after the file is made: wait for the line, not the file.
        wait_until(
            lambda: received.exists() and received.read_text().endswith("\n"),
            "the fake daemon to see the connection close",
        )
        assert received.read_text().split() == ["0"]  # connected, but not one byte was sent
    finally:
        os.killpg(fake.pid, signal.SIGKILL)
        fake.wait()


def test_restarted_system_daemon_readopts_every_users_running_jobs(system, users):
    alice, bob = users
    jobs = {
        alice: system.submit(alice, "--", "sleep", "300"),
        bob: system.submit(bob, "--", "sleep", "300"),
    }
    before = {}
    for user, job_id in jobs.items():
        before[job_id] = system.wait_state(job_id, "running")
        uids = wait_until(
            lambda: (u := _run_uids(system, job_id)) and u[1] and u,  # noqa: B023 - called within this turn of the loop
            f"job {job_id}'s processes",
        )
        assert uids == (0, {user.uid})  # a root shim, the job as its user
    system.kill()
    system.start()
    for job_id in jobs.values():
        job = system.show(job_id)
        assert job["state"] == "running", job
        assert job["started_at"] == before[job_id]["started_at"]
    # Adopted for real: a cancel reaches each job through its original shim.
    system.run_as(None, "cancel", *map(str, jobs.values()))
    for job_id in jobs.values():
        assert system.wait_state(job_id, "cancelled")["state"] == "cancelled"


def test_only_root_stops_the_system_daemon(system, users):
    alice, _ = users
    proc = system.run_as(alice, "daemon", "stop", check=False)
    assert proc.returncode == 1 and "only root" in proc.stderr
    assert system.audit()[-1]["request"] == "stop"
    assert "gpusched daemon stopped" in system.run_as(None, "daemon", "stop").stdout
    system.wait_gone()


def test_admin_group_members_act_on_anyones_jobs_and_show_commands_all(make_system, users):
    alice, bob = users
    system = make_system(f'[system]\nadmin_group = "{alice.extra_group}"\nshow_commands = "all"\n')
    bobs = system.submit(bob, "--hold", "--", "sleep", "300")
    alices = system.submit(alice, "--hold", "--", "sleep", "300")
    # show_commands = "all": everyone sees every command line.
    assert {j["id"]: j for j in system.json_as(bob, "ls")}[alices]["command"] == ["sleep", "300"]
    # alice is an admin through the group; bob is not.
    system.run_as(alice, "update", str(bobs), "--priority", "3")
    assert system.show(bobs)["priority"] == 3
    assert "HOME" in system.json_as(alice, "env", str(bobs))
    assert system.run_as(bob, "cancel", str(alices), check=False).returncode == 1
    system.run_as(alice, "drain")
    assert system.run_as(bob, "resume", check=False).stderr.startswith(
        "Error: only an admin may drain or resume the queue"
    )
    assert [(e["user"], e["request"]) for e in system.audit()] == [
        (bob.name, "cancel"),
        (bob.name, "resume"),
    ]
