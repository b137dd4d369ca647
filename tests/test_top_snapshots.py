"""`gpusched top` asks for a snapshot every second: the pending jobs come again only when
they changed, and top keeps drawing the ones it has."""

from __future__ import annotations

import os

from gpusched.client.paths import resolve_paths
from gpusched.gpus import open_backend
from gpusched.tui.snapshot import SnapshotSource


def job_ids(reply: dict) -> list[int]:
    return [job["id"] for job in reply["jobs"]]


def test_pending_jobs_come_again_only_when_they_changed(box):
    running = box.submit("--gpus", "4", "--", "true")
    pending = box.submit_all("--gpus", "1", "--from-file", "-", stdin="true\n" * 3)
    first = box.call("snapshot", lean=True)
    assert job_ids(first) == [running, *pending] and not first["pending_same"]
    version = first["pending_version"]
    again = box.call("snapshot", lean=True, pending_version=version)
    assert job_ids(again) == [running] and again["pending_same"]
    assert again["pending_version"] == version
    # A running job's own changes (its progress, its end) do not resend the queue...
    box.step(5.0)
    assert box.call("snapshot", lean=True, pending_version=version)["pending_same"]
    # ...but any change to a pending job does: a new one, a hold, a start.
    for change in (
        lambda: box.submit("--hold", "--", "true"),
        lambda: box.call("release", ids=[str(pending[0])]),
        lambda: box.exit(running),
    ):
        change()
        reply = box.call("snapshot", lean=True, pending_version=version)
        assert not reply["pending_same"] and reply["pending_version"] != version
        version = reply["pending_version"]
    assert box.call("snapshot", lean=True, pending_version="another daemon's.1")["jobs"]


def test_an_unknown_version_gets_every_job(box):
    ids = box.submit_all("--gpus", "1", "--from-file", "-", stdin="true\n" * 6)
    reply = box.call("snapshot", lean=True, pending_version="1234abcd.7")
    assert job_ids(reply) == ids and not reply["pending_same"]


def test_top_keeps_the_pending_jobs_it_has_and_sees_changes(home, monkeypatch):
    home.start()
    running = home.submit("--gpus", "4", "--", "sleep", "60")
    home.wait_state(running, "running")
    queued = [home.submit("--gpus", "1", "--name", f"wait-{n}", "--", "true") for n in range(3)]
    for key, value in home.env.items():
        monkeypatch.setenv(key, value)
    source = SnapshotSource(open_backend, paths=resolve_paths(dict(os.environ)))
    sent = []
    call = source.client.call

    def counting(cmd, **args):
        reply = call(cmd, **args)
        sent.append(len(reply["jobs"]))
        versions.append(args.get("pending_version", "not sent"))
        return reply

    versions: list = []
    monkeypatch.setattr(source.client, "call", counting)
    try:
        frames = [source.take() for _ in range(3)]
        for frame in frames:
            assert [(j.id, j.state) for j in frame.jobs] == (
                [(running, "running")] + [(i, "pending") for i in queued]
            )
        assert sent == [4, 1, 1]  # the queue once, then only the running job
        # Not sent at all at first: a daemon older than pending_version refuses it.
        assert versions[0] == "not sent" and versions[1] == versions[2] != "not sent"
        home.run("cancel", str(queued[1]))
        frame = source.take()
        assert [j.id for j in frame.jobs] == [running, queued[0], queued[2]]
    finally:
        source.close()
        home.run("cancel", str(running))
