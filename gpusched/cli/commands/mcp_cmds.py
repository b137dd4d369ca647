"""`gpusched mcp`: serve the queue to AI assistants over the Model Context Protocol (gpusched/mcp/)."""

from __future__ import annotations

import importlib.util
import os

import typer

from gpusched.cli import cmdoptions
from gpusched.cli.helpformat import App
from gpusched.core.errors import GpuschedError

app = App()

# The CLI's option tables the tools take their parameters from (gpusched/mcp/tools.py).
TABLES = {
    **{name: rows for name, (_, rows) in cmdoptions.FAST_COMMANDS.items()},
    "usage": cmdoptions.USAGE,
    "requeue": (),
}


@app.command()
def mcp(
    http: int | None = typer.Option(
        None,
        "--http",
        metavar="PORT",
        min=1,
        max=65535,
        help="Speak streamable HTTP on 127.0.0.1:PORT instead of standard input and "
        "output; each request needs the bearer token it writes to mcp-token in your state "
        "directory (docs/mcp.md).",
    ),
    read_only: bool = typer.Option(
        False,
        "--read-only",
        help="Offer only the tools that look, as [mcp] allow_mutations = false does.",
    ),
) -> None:
    """Serve the queue to AI assistants (Model Context Protocol).

    An assistant (Claude Desktop or Code, an IDE) starts `gpusched mcp` and talks to it
    on standard input and output: tools to list, show, preview, submit, cancel, hold,
    release, requeue and resubmit jobs, read their logs, see the GPUs and the usage;
    resources for the queue, the GPUs, each job and its log. It acts as the user who runs
    it: the daemon allows it what it allows them. Needs the mcp extra:
    pip install 'gpusched-cli[mcp]'. docs/mcp.md tells more.

    \b
    Examples:
      gpusched mcp --read-only
      claude mcp add gpusched -- gpusched mcp      # register it with Claude Code
    """
    if importlib.util.find_spec("mcp") is None:
        raise GpuschedError(
            "`gpusched mcp` needs the MCP SDK, which is not installed. Install it with "
            "`pip install 'gpusched-cli[mcp]'` (or `pipx inject gpusched-cli mcp`)"
        )
    from gpusched.client.modes import client_paths  # noqa: PLC0415 - as the SDK below
    from gpusched.client.paths import resolve_paths  # noqa: PLC0415 - as the SDK below
    from gpusched.core.config import load_settings  # noqa: PLC0415 - 70 ms of every command
    from gpusched.mcp import server  # noqa: PLC0415 - the SDK: only for this command

    paths = client_paths()
    settings = load_settings(paths.config_file, environ={})
    allow = settings.mcp_allow_mutations and not read_only
    own = resolve_paths()  # the user's own state directory, even when a system daemon serves
    token_file = os.path.join(own.state_dir, "mcp-token")
    if http is not None:
        os.makedirs(own.state_dir, mode=0o700, exist_ok=True)
    server.serve(server.build(TABLES, allow_mutations=allow), http_port=http, token_file=token_file)
