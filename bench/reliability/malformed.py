"""Malformed requests, straight onto the daemon's socket: each is refused with an answer;
none raises inside the daemon, goes unanswered, is stored, or kills the daemon."""

from __future__ import annotations

import json

from reliability.harness import Figures, Home, frame, is_gone, poll, raw_request, request

HUGE = 9 * 2**20  # bytes: with a few such jobs, a listing outgrows the 16 MiB frame limit
FAILED_ON_REQUEST = "failed on this request"


def _submit(**changes: object) -> bytes:
    """A submit of one held job with one field made wrong."""
    spec = {"command": ["true"], "hold": True, **changes}
    return request("submit", jobs=[spec], env={}, cwd="/")


def _submit_args(**args: object) -> bytes:
    return request(
        "submit", **{"jobs": [{"command": ["true"], "hold": True}], "env": {}, "cwd": "/", **args}
    )


def classes(array_id: int, held_id: int) -> list[tuple[str, bytes, str]]:
    """(class, the bytes sent, "refuse" or "any" when no answer is owed)."""
    deep = b"[" * 100_000 + b"]" * 100_000
    out = [
        ("frame over the size limit", b"\x01\x00\x00\x01", "refuse"),
        ("frame of length 0", frame(b""), "refuse"),
        ("frame cut short", b"\x00\x00\x00\x64" + b"{" * 10, "any"),
        ("header cut short", b"\x00\x00", "any"),
        ("body not JSON", frame(b"hello"), "refuse"),
        ("body not UTF-8", frame(b'{"cmd": "\xff\xfe"}'), "refuse"),
        ("JSON array", frame(b"[1, 2]"), "refuse"),
        ("JSON string", frame(b'"ping"'), "refuse"),
        ("100k-deep nesting", frame(b'{"cmd": "show", "args": {"ids": ' + deep + b"}}"), "refuse"),
        (
            "5000-digit integer",
            frame(b'{"cmd": "show", "args": {"ids": [' + b"9" * 5000 + b"]}}"),
            "refuse",
        ),
        ("cmd not a string", frame(b'{"cmd": 5}'), "refuse"),
        ("unknown cmd", request("format_disk"), "refuse"),
        ("args not an object", frame(b'{"cmd": "show", "args": [1]}'), "refuse"),
        ("missing argument", request("show"), "refuse"),
        ("extra argument", request("show", ids=[held_id], sudo=True), "refuse"),
        ("ids not a list", request("show", ids=str(held_id)), "refuse"),
        ("huge id", request("show", ids=[10**30]), "refuse"),
        ("id null", request("cancel", ids=[None]), "refuse"),
        ("id a list", request("cancel", ids=[[held_id]]), "refuse"),
        ("id true", request("cancel", ids=[True]), "refuse"),
        ("id negative", request("hold", ids=[-1]), "refuse"),
        ("empty array index (5_)", request("cancel", ids=[f"{array_id}_"]), "refuse"),
        (
            "wait timeout NaN",
            frame(b'{"cmd": "wait", "args": {"ids": [%d], "timeout_s": NaN}}' % held_id),
            "refuse",
        ),
        ("wait timeout a string", request("wait", ids=[held_id], timeout_s="soon"), "refuse"),
        ("list limit a string", request("list", limit="x"), "refuse"),
        ("list users a string", request("list", users="root"), "refuse"),
        ("priority a string", request("update", ids=[held_id], priority="high"), "refuse"),
        ("priority huge", request("update", ids=[held_id], priority=10**30), "refuse"),
        ("logs id a list", request("logs", id=[held_id]), "refuse"),
        ("resubmit changes a list", request("resubmit", id=held_id, changes=[1]), "refuse"),
        ("jobs not a list", request("submit", jobs="true", env={}, cwd="/"), "refuse"),
        ("jobs empty", request("submit", jobs=[], env={}, cwd="/"), "refuse"),
        ("command empty", _submit(command=[]), "refuse"),
        ("command not strings", _submit(command=[5]), "refuse"),
        ("gpus a string", _submit(gpus="1"), "refuse"),
        ("gpus negative", _submit(gpus=-1), "refuse"),
        ("gpus true", _submit(gpus=True), "refuse"),
        ("gpus 1e308", _submit(gpus=1e308), "refuse"),
        ("gpu index true", _submit(gpus=1, constraints={"gpu_ids": [True]}), "refuse"),
        ("array a number", _submit(array=5), "refuse"),
        ("array indices [true]", _submit(array={"indices": [True]}), "refuse"),
        ("array index 2**40", _submit(array={"indices": [2**40]}), "refuse"),
        ("topology false", _submit(constraints={"topology": False}), "refuse"),
        # json keeps the last of a key given twice: this one stopped the daemon.
        ("a key twice (ping, then stop)", frame(b'{"cmd": "ping", "cmd": "stop"}'), "refuse"),
        (
            "a key twice in a job",
            frame(
                b'{"cmd": "submit", "args": {"jobs": [{"command": '
                b'["true"], "hold": true, "hold": false}], "env": {}, '
                b'"cwd": "/"}}'
            ),
            "refuse",
        ),
        ("a key beside cmd and args", frame(b'{"cmd": "ping", "as_uid": 0}'), "refuse"),
        ("retry_on [[1]]", _submit(retry_on=[[1]]), "refuse"),
        ("dependency on a huge id", _submit(dependencies=[["afterok", 10**30]]), "refuse"),
        (
            "time limit NaN",
            frame(
                b'{"cmd": "submit", "args": {"jobs": [{"command": ["true"], '
                b'"hold": true, "time_limit_s": NaN}], "env": {}, "cwd": "/"}}'
            ),
            "refuse",
        ),
        ("env a string", _submit_args(env="A=1"), "refuse"),
        ("env value a number", _submit_args(env={"A": 5}), "refuse"),
        ("cwd a number", _submit_args(cwd=5), "refuse"),
        ("name of 9 MiB", _submit(name="n" * HUGE), "refuse"),
        ("command of 9 MiB", _submit(command=["true", "x" * HUGE]), "refuse"),
        ("cwd of 9 MiB", _submit_args(cwd="/" + "d" * HUGE), "refuse"),
        ("environment of 9 MiB", _submit_args(env={"PAD": "e" * HUGE}), "refuse"),
        # One more than limits.jobs allows: refused at once. (100,000 are queued in batches
        # that leave the loop free: bench/bench_big_batches.py measures that.)
        (
            "100,001 jobs in one submit",
            request(
                "submit", jobs=[{"command": ["true"], "hold": True}] * 100_001, env={}, cwd="/"
            ),
            "refuse",
        ),
    ]
    return out


def _send(home: Home, sock: str, data: bytes, fig: Figures, name: str, expect: str) -> None:
    before = home.tracebacks()
    answer = raw_request(sock, data, timeout_s=5)
    # An exception on a connection's thread reaches the log after the connection closed.
    poll(lambda: home.tracebacks() > before, 0.3)
    if home.tracebacks() > before or (
        isinstance(answer, dict) and FAILED_ON_REQUEST in str(answer.get("error"))
    ):
        fig.fail("exceptions", name)
    elif expect == "refuse" and not isinstance(answer, dict):
        fig.fail("no_reply", f"{name}: {answer or 'nothing within 5 s'}")
    elif expect == "refuse" and answer.get("ok"):
        fig.fail("accepted", f"{name}: {json.dumps(answer)[:120]}")


def measure(small: bool) -> Figures:
    fig = Figures("malformed requests")
    fig.counts.update(exceptions=0, no_reply=0, accepted=0, daemon_deaths=0, listing_broken=0)
    home = Home("malformed")
    try:
        home.start()
        status = home.json("daemon", "status", "--json")
        sock, pid = status["socket"], status["pid"]
        held = int(home.cli("submit", "--hold", "--", "true").stdout)
        array = int(home.cli("submit", "--hold", "--array", "0-3", "--", "true").stdout.split()[0])
        chosen = classes(array, held)
        fig.info["classes"] = len(chosen)
        for name, data, expect in chosen:
            _send(home, sock, data, fig, name, expect)
            if is_gone(pid):
                fig.fail("daemon_deaths", name)
                pid = home.start() or pid
        if home.jobs() is None:
            fig.fail("listing_broken", "`ls --all --json` fails after them")
        fig.info["tracebacks_in_log"] = home.tracebacks()
    finally:
        home.close()
    return fig
