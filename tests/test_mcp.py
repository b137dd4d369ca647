"""`gpusched mcp`: the MCP server, driven by the MCP SDK's own client over stdio, as an
assistant drives it, against a real daemon on simulated GPUs; its tools' parameters read
from the CLI's option tables; a submit's preview in the daemon."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import DEADLINE_S, Home, wait_until
from gpusched.cli.app import main
from gpusched.cli.commands.mcp_cmds import TABLES
from gpusched.core.errors import UsageError

pytest.importorskip("mcp")  # the mcp extra brings it

import mcp_types as types
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp.shared._httpx_utils import create_mcp_http_client

from gpusched.mcp import server, tools

LOOKING = {
    "list_jobs",
    "show_job",
    "read_log",
    "gpu_status",
    "why_pending",
    "preview_submit",
    "usage",
}
CHANGING = {"submit", "resubmit", "cancel", "hold", "release", "requeue"}


def stdio(home: Home, *args: str) -> StdioServerParameters:
    """`gpusched mcp ARGS` as an assistant starts it: a child speaking on stdin and stdout."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "gpusched", "mcp", *args],
        env=home.env,
        cwd=str(home.path),
    )


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, DEADLINE_S))


async def tool_schemas(built: MCPServer) -> dict[str, types.Tool]:
    return {tool.name: tool for tool in await built.list_tools()}


# -- the tools' parameters: one source with the CLI ---------------------------------------


def test_each_tools_parameters_are_its_cli_commands_options():
    listed = run(tool_schemas(server.build(TABLES)))
    assert set(listed) == LOOKING | CHANGING
    tables = tools.option_tables(TABLES)
    for name, tool in listed.items():
        command, argument = tools.TOOLS[name][1:3]
        properties = tool.input_schema["properties"]
        expected = {row[0] for row in tables[command] if row[0] not in tools.PRINTING}
        if name == "preview_submit":
            expected -= {"wait", "hold"}
        if name == "read_log":
            expected.add("lines")
        if argument:
            expected.add(tools.ARGUMENTS[argument][0])
        assert set(properties) == expected, name
        for row in tables[command]:
            if row[0] in properties:  # the CLI's help, and its type
                assert properties[row[0]]["description"].startswith(row[4]), (name, row[0])
    submit = listed["submit"].input_schema
    assert submit["required"] == ["command"]
    priority = submit["properties"]["priority"]
    assert (priority["type"], priority["default"]) == ("integer", 0)  # SUBMIT's int, default 0
    gpus = submit["properties"]["gpus"]  # a str whose default is None: not given
    assert {"type": "string"} in gpus["anyOf"] and "--gpus" in gpus["description"]
    assert submit["properties"]["env"]["type"] == "array"  # given once per value


def test_a_new_cli_option_is_a_new_tool_parameter():
    # The CLI's table is the source: a row added there reaches the tool, with its help.
    row = ("retries_max", ("--retries-max",), "int", None, "A made-up option.")
    listed = run(tool_schemas(server.build({**TABLES, "ls": (*TABLES["ls"], row)})))
    assert (
        listed["list_jobs"]
        .input_schema["properties"]["retries_max"]["description"]
        .startswith("A made-up option.")
    )


def test_the_tools_say_what_they_change():
    listed = run(tool_schemas(server.build(TABLES)))
    for name, tool in listed.items():
        hints = tool.annotations
        assert hints is not None and hints.read_only_hint is (name in LOOKING), name
        assert hints.destructive_hint is (name in {"cancel", "requeue"}), name


def test_read_only_lists_only_the_tools_that_look():
    listed = run(tool_schemas(server.build(TABLES, allow_mutations=False)))
    assert set(listed) == LOOKING


def test_without_the_sdk_mcp_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "mcp", None)  # as if not installed: find_spec says None
    assert main(["mcp"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("Error: ")
    assert "pip install 'gpusched-cli[mcp]'" in err


# -- the daemon's preview --------------------------------------------------------------------


def test_a_preview_names_the_gpus_or_why_it_would_wait_and_queues_nothing(box):
    request = {"jobs": [{"command": ["true"], "gpus": 2}], "cwd": "/"}
    preview = box.call("submit", dry_run=True, **request)
    assert preview["would_start"] and len(preview["gpu_indices"]) == 2
    assert preview["reason"] is None
    assert box.call("list")["jobs"] == []
    for _ in range(4):
        box.submit("--gpus", "1", "--", "sleep", "100")
    box.step()
    assert len(box.running()) == 4
    box.submit("--gpus", "1", "--", "true")  # waits: counted as ahead
    preview = box.call("submit", dry_run=True, **request)
    assert not preview["would_start"] and preview["gpu_indices"] == []
    assert preview["reason"] and preview["pending_ahead"] == 1
    assert len(box.call("list", all=True)["jobs"]) == 5
    # A job no GPU of this machine could ever take is refused as a submit would be.
    with pytest.raises(UsageError, match="see `gpusched gpus`"):
        box.call("submit", dry_run=True, jobs=[{"command": ["true"], "gpus": 8}], cwd="/")


# -- a real server over stdio, against a real daemon -------------------------------------------


def text(result: types.CallToolResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def call(client: Client, tool: str, **arguments) -> dict:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, (tool, text(result))
    assert result.structured_content is not None
    return result.structured_content


def test_every_tool_against_a_real_daemon(home: Home, tmp_path: Path):
    gate = tmp_path / "gate"

    async def drive() -> None:
        async with Client(stdio(home)) as client:
            listed = {tool.name for tool in (await client.list_tools()).tools}
            assert listed == LOOKING | CHANGING
            gpus = await call(client, "gpu_status")
            assert len(gpus["gpus"]) == 4
            preview = await call(client, "preview_submit", command=["true"], gpus="1")
            assert preview["would_start"] and len(preview["gpu_indices"]) == 1
            assert (await call(client, "list_jobs"))["jobs"] == []  # the preview queued nothing

            # A submit that runs, waited for: its exit code comes back.
            ended = await call(
                client,
                "submit",
                command=["sh", "-c", "echo hello; exit 3"],
                wait=True,
                name="three",
            )
            assert ended["ended"] == [
                {"id": ended["id"], "state": "failed", "exit_code": 3, "exit_status": 3}
            ]
            log = await call(client, "read_log", job_id=str(ended["id"]))
            assert log["lines"] == ["hello"]
            shown = await call(client, "show_job", job_id=str(ended["id"]))
            assert shown["name"] == "three" and shown["exit_code"] == 3
            again = await call(client, "resubmit", job_id=str(ended["id"]), wait=True, name="four")
            assert again["ended"][0]["exit_status"] == 3
            assert home.show(again["id"])["name"] == "four"

            held = (await call(client, "submit", command=["sleep", "100"], hold=True))["id"]
            why = await call(client, "why_pending", job_id=str(held))
            assert why["state"] == "pending" and "release" in why["pending_reason"]
            assert "start_forecast" in why  # None: a held job has no forecast start
            assert (await call(client, "release", job_ids=[str(held)]))["refused"] == {}
            home.wait_state(held, "running")
            await call(client, "hold", job_ids=[str(held)])  # running: refused, said so
            requeued = await call(client, "requeue", job_ids=[str(held)])
            assert requeued["refused"] == {}
            cancelled = await call(client, "cancel", job_ids=[str(held)])
            assert cancelled["refused"] == {}
            home.wait_state(held, "cancelled")

            mine = await call(client, "list_jobs", all_jobs=True, names="three,four")
            assert [job["name"] for job in mine["jobs"]] == ["three", "four"]
            usage = await call(client, "usage", by="name")
            assert {group["key"] for group in usage["groups"]} >= {"three", "four"}

            # A mistake reads as the CLI's error, as a tool error.
            missing = await client.call_tool("show_job", {"job_id": "999"})
            assert missing.is_error and "999" in text(missing)

            queue = await client.read_resource("gpusched://queue")
            assert '"jobs"' in queue.contents[0].text
            job = await client.read_resource(f"gpusched://jobs/{ended['id']}")
            assert '"three"' in job.contents[0].text
            log_text = await client.read_resource(f"gpusched://jobs/{ended['id']}/log")
            assert log_text.contents[0].text == "hello\n"
            assert '"gpus"' in (await client.read_resource("gpusched://gpus")).contents[0].text

            # A subscription to a running job's resource hears that it ended.
            job_id = (
                await call(
                    client,
                    "submit",
                    command=["sh", "-c", f"until [ -e {gate} ]; do sleep 0.05; done"],
                )
            )["id"]
            home.wait_state(job_id, "running")
            uri = f"gpusched://jobs/{job_id}"
            async with client.listen(resource_subscriptions=[uri]) as subscription:
                gate.touch()
                event = await anext(aiter(subscription))
            assert event.uri == uri
            assert home.show(job_id)["state"] == "succeeded"

    run(drive())


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
def test_a_client_of_the_older_protocol_subscribes_and_hears_a_job_end(home: Home, tmp_path: Path):
    # Assistants of MCP 2025-11-25 and before subscribe with resources/subscribe.
    gate = tmp_path / "gate"
    heard: asyncio.Queue = asyncio.Queue()

    async def note(message) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            await heard.put(message.params.uri)

    async def drive() -> None:
        async with Client(stdio(home), mode="legacy", message_handler=note) as client:
            command = ["sh", "-c", f"until [ -e {gate} ]; do sleep 0.05; done"]
            job_id = (await call(client, "submit", command=command))["id"]
            home.wait_state(job_id, "running")
            await client.subscribe_resource(f"gpusched://jobs/{job_id}")
            gate.touch()
            assert await heard.get() == f"gpusched://jobs/{job_id}"
            assert home.show(job_id)["state"] == "succeeded"

    run(drive())


def test_a_submit_and_a_cancel_ask_the_user_first(home: Home):
    answers: list[str] = []
    asked: list[str] = []

    async def answer(context, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        if answers.pop(0) == "yes":
            return types.ElicitResult(action="accept", content={"confirm": True})
        return types.ElicitResult(action="decline")

    async def drive() -> None:
        async with Client(stdio(home), elicitation_callback=answer) as client:
            answers.append("no")
            refused = await client.call_tool("submit", {"command": ["sleep", "100"], "hold": True})
            assert refused.is_error and "did not confirm" in text(refused)
            assert home.jobs() == []
            answers.append("yes")
            job_id = (await call(client, "submit", command=["sleep", "100"], hold=True))["id"]
            answers.append("no")
            refused = await client.call_tool("cancel", {"job_ids": [str(job_id)]})
            assert refused.is_error and home.show(job_id)["state"] == "pending"
            answers.append("yes")
            await call(client, "cancel", job_ids=[str(job_id)])
            assert home.show(job_id)["state"] == "cancelled"
            await call(client, "hold", job_ids=[str(job_id)])  # asks nothing

    run(drive())
    assert asked[0] == "gpusched: queue this job? sleep 100"
    assert len(asked) == 4 and asked[2].startswith("gpusched: cancel job(s)")


def test_allow_mutations_false_makes_it_read_only(home: Home):
    home.write_config("[mcp]\nallow_mutations = false\n")

    async def drive() -> None:
        async with Client(stdio(home)) as client:
            listed = {tool.name for tool in (await client.list_tools()).tools}
            assert listed == LOOKING
            refused = await client.call_tool("submit", {"command": ["true"]})
            assert refused.is_error
        async with Client(stdio(home, "--read-only")) as client:  # the flag, too
            home.write_config()
            assert {tool.name for tool in (await client.list_tools()).tools} == LOOKING

    run(drive())
    assert home.jobs() == []


def test_http_on_the_loopback_address(home: Home):
    with socket.socket() as probe:  # a port free now; the server takes it at once
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "gpusched", "mcp", "--http", str(port)],
        env=home.env,
        cwd=home.path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    token_file = Path(home.env["GPUSCHED_HOME"]) / "state" / "mcp-token"

    def refused_without_the_token() -> int:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", data=b"{}", method="POST")
        try:
            urllib.request.urlopen(request, timeout=10)
        except urllib.error.HTTPError as exc:
            return exc.code
        return 200

    async def drive() -> int:
        token = token_file.read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        http = create_mcp_http_client(headers=headers)
        transport = streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)
        async with Client(transport) as client:
            return len((await call(client, "gpu_status"))["gpus"])

    try:
        wait_until(listening, "gpusched mcp --http to listen")
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert refused_without_the_token() == 401
        assert run(drive()) == 4
    finally:
        server.kill()
        server.wait()
