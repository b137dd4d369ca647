"""Each tool's parameters, read from the CLI's option tables, so an option is declared once."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import Field

# An option row's kind (client/submit/options.py) -> the type of its value.
_TYPES: dict[str, Any] = {"str": str, "int": int, "flag": bool, "yesno": bool, "list": list[str]}

# What a command takes besides its options (cli/cmdoptions.py FAST_COMMANDS's "one" and
# "many", submit's command) -> a row of the same shape.
ARGUMENTS: dict[str, tuple[Any, ...]] = {
    "one": ("job_id", (), "str", ..., "Job id, or ARRAY_INDEX (12_3) for one element of an array."),
    "many": (
        "job_ids",
        (),
        "list",
        ...,
        "Job ids; an array's id means all its elements, ARRAY_INDEX (12_3) one.",
    ),
    "command": (
        "command",
        (),
        "list",
        ...,
        'The command to run, one word per item, e.g. ["python", "train.py"]; run in the '
        'working directory, without a shell (give ["sh", "-c", "..."] for one).',
    ),
}

Body = Callable[..., Awaitable[dict[str, Any]]]


def parameter(row: Sequence[Any]) -> inspect.Parameter:
    """A keyword parameter for one option row: its field's name, type, default and help
    (the flags named too: what a user reads in `--help`). A default of ... is required."""
    field, flags, kind, default, help_text, *_ = row
    kind_type = _TYPES[kind]
    optional = default is None
    described = f"{help_text} (gpusched's {', '.join(flags)})" if flags else help_text
    return inspect.Parameter(
        field,
        inspect.Parameter.KEYWORD_ONLY,
        default=inspect.Parameter.empty if default is ... else default,
        annotation=Annotated[
            kind_type | None if optional else kind_type, Field(description=described)
        ],
    )


def tool_function(
    name: str,
    doc: str,
    body: Body,
    rows: Sequence[Sequence[Any]],
    resolved: Sequence[inspect.Parameter] = (),
) -> Body:
    """An async function the SDK registers as a tool: its signature (which the SDK turns
    into the input schema and checks each call against) is the rows', then the resolved
    parameters, which the SDK fills itself (a user's confirmation: not in the schema);
    a call hands them all to body(ctx, arguments)."""

    async def tool(ctx: Context, **arguments: Any) -> dict[str, Any]:
        return await body(ctx, arguments)

    params = [*(parameter(row) for row in rows), *resolved]
    params.append(inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context))
    tool.__signature__ = inspect.Signature(params, return_annotation=dict[str, Any])  # type: ignore[attr-defined]  # read by inspect.signature, as typer's commands are
    tool.__annotations__ = {p.name: p.annotation for p in params} | {"return": dict[str, Any]}
    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = doc
    return tool
