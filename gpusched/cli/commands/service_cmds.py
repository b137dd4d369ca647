"""`gpusched service ...`: inference services behind an HAProxy front door (docs/services.md).

(`gpusched daemon install-service` is the systemd unit of the daemon, cli/systemd.py.)
"""

from __future__ import annotations

from typing import Any

import typer

from gpusched.cli.commands.submit_cmds import with_options
from gpusched.cli.common import JSON_HELP, out
from gpusched.cli.helpformat import App
from gpusched.cli.views.servicetext import details, table
from gpusched.client.connection import Client
from gpusched.client.submit.jobrequest import build_request, check_limits, env_pairs
from gpusched.client.submit.options import SUBMIT, SubmitOptions
from gpusched.client.submit.submitting import print_json
from gpusched.core import services as model
from gpusched.core.errors import UsageError
from gpusched.core.units import parse_duration

app = App(
    no_args_is_help=True,
    help=(
        "Inference services: jobs behind a front door, autoscaled.\n\n"
        "Each service's replicas are jobs behind an HAProxy front door; docs/services.md "
        "explains them with a worked example.\n\n"
        "\b\nExamples:\n  gpusched service create web --replicas 1:3 -- python serve.py\n"
        "  gpusched service ls"
    ),
)

# submit's options that shape each replica's job; the rest (arrays, dependencies, waiting,
# time limits, retries) do not fit a server that runs until it is stopped.
_JOB_FIELDS = (
    "gpus",
    "gpu_mem",
    "priority",
    "cwd",
    "env",
    "policy",
    "gpu_ids",
    "exclude_gpus",
    "gpu_type",
    "min_gpu_total_mem",
    "min_compute_capability",
    "cpus",
    "mem",
)
JOB_OPTIONS = tuple(row for row in SUBMIT if row[0] in _JOB_FIELDS)
_COMMAND = typer.Argument(
    None, metavar="-- COMMAND...", help="The server; it listens on 127.0.0.1:$PORT."
)
_NAME = typer.Argument(..., metavar="NAME", help="The service.")
_JSON = typer.Option(False, "--json", help=JSON_HELP)
_REPLICAS_HELP = "MIN[:MAX] replicas; with a MAX, autoscaled between them on load."


def job_spec(command: list[str], options: dict[str, Any], service: str) -> dict[str, Any]:
    """What each replica runs: a submit's job spec, environment and directory."""
    opts = SubmitOptions(command=command, name=service, **options)
    request = build_request(opts)
    check_limits(request)  # refused before a front door starts, as the daemon would
    return {"job": request["jobs"][0], "env": request["env"], "cwd": request["cwd"]}


def job_changes(command: list[str], options: dict[str, Any], service: str) -> dict[str, Any]:
    """What an update changes of each replica's job: the new command, and only the options
    given (the daemon keeps the rest, --gpus say); --env over the service's environment."""
    given = {k: v for k, v in options.items() if v != SubmitOptions.DEFAULTS[k]}
    probe = command or ["true"]  # no new command: the service keeps its own
    new, same = job_spec(probe, given, service), job_spec(probe, {}, service)
    changes = {"job": _changed(new["job"], same["job"]), "env": env_pairs(given.get("env", ()))}
    if command:
        changes["job"]["command"] = command
    if "gpus" in given:  # --gpus 0 too, the same as no --gpus at submit
        changes["job"]["gpus"] = new["job"]["gpus"]
    else:  # one implied by --gpu-mem, say: the daemon's to work out
        changes["job"].pop("gpus", None)
    if "cwd" in given:
        changes["cwd"] = new["cwd"]
    return changes


def _changed(new: dict[str, Any], same: dict[str, Any]) -> dict[str, Any]:
    """The keys of `new` whose values differ from `same`'s (a nested mapping: its own)."""
    out = {}
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(same.get(key), dict):
            value = _changed(value, same[key])
            if value:
                out[key] = value
        elif value != same.get(key):
            out[key] = value
    return out


def replicas_spec(text: str) -> dict[str, int]:
    low, high = model.parse_replicas(text)
    return {"min_replicas": low, "max_replicas": high}


def _seconds(text: str | None, option: str) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError:
        raise UsageError(f"{option} {text!r} is not a duration; e.g. 30s, 2m, 200ms") from None


@app.command()
@with_options(JOB_OPTIONS)
def create(
    name: str = _NAME,
    command: list[str] | None = _COMMAND,
    replicas: str = typer.Option("1", "--replicas", "-r", help=_REPLICAS_HELP),
    listen: str = typer.Option(
        "127.0.0.1:0", "--listen", help="The front door's HOST:PORT (port 0: a free one)."
    ),
    balance: str = typer.Option(
        "roundrobin", "--balance", help="roundrobin, leastconn or weighted."
    ),
    weights: str | None = typer.Option(
        None,
        "--weights",
        help="With --balance weighted: one weight per replica, 3,1 (default: each GPU's GiB).",
    ),
    health: str = typer.Option(
        "",
        "--health",
        help="HTTP path that answers 200 while a "
        "replica is healthy, /healthz (default: it accepts connections).",
    ),
    target_latency: str | None = typer.Option(
        None, "--target-latency", help="Autoscaling: p95 latency to stay under, 200ms."
    ),
    target_in_flight: float = typer.Option(
        4.0, "--target-in-flight", help="Autoscaling: requests in flight per replica."
    ),
    window: str = typer.Option(
        "30s", "--window", help="Autoscaling: how long a load must last before replicas change."
    ),
    cooldown: str = typer.Option(
        "60s", "--cooldown", help="Autoscaling: the least time between two changes."
    ),
    schedule: list[str] = typer.Option(
        [], "--schedule", help="At most N replicas in a daily window, HH:MM-HH:MM=N; repeatable."
    ),
    as_json: bool = _JSON,
    **options: Any,
) -> None:
    """Define a service and start its replicas behind a front door.

    Each replica is an ordinary job running COMMAND with $PORT set to its own port;
    gpusched keeps the number wanted running, restarts those that die, and sends
    requests to those that pass their health check.

    \b
    Examples:
      gpusched service create chat --gpus 1 --replicas 1:4 --health /healthz \\
          --listen 127.0.0.1:8080 -- python jobs/serve.py
      gpusched service create emb --replicas 2 --balance leastconn -- ./serve.sh
    """
    latency_s = _seconds(target_latency, "--target-latency")
    spec = {
        **job_spec(list(command or []), options, model.check_name(name)),
        **replicas_spec(replicas),
        "listen": model.parse_listen(listen),
        "balance": model.parse_balance(balance),
        "weights": list(model.parse_weights(weights)),
        "health": model.parse_health(health),
        "schedule": [list(w) for w in model.parse_schedule(schedule)],
        "autoscale": {
            "target_in_flight": target_in_flight,
            "target_latency_ms": latency_s * 1000 if latency_s else None,
            "window_s": _seconds(window, "--window"),
            "cooldown_s": _seconds(cooldown, "--cooldown"),
        },
    }
    if weights and balance != "weighted":
        raise UsageError("--weights goes with --balance weighted")
    shown = Client().call("service", action="create", name=name, spec=spec)
    _print(shown, as_json)


@app.command("ls")
def list_services(as_json: bool = _JSON) -> None:
    """The services: replicas wanted and running, front door, requests.

    \b
    Examples:
      gpusched service ls
      gpusched service ls --json
    """
    services = Client().call("service", action="list")["services"]
    if as_json:
        print_json(services)
        return
    if not services:
        out.print("no services; `gpusched service create -h` tells how to make one")
        return
    out.print(table(services))


@app.command()
def show(name: str = _NAME, as_json: bool = _JSON) -> None:
    """One service: replicas, front door, load, update, events.

    \b
    Examples:
      gpusched service show web
    """
    _print(Client().call("service", action="show", name=name), as_json)


@app.command()
def scale(
    name: str = _NAME,
    replicas: int = typer.Argument(..., metavar="N", help="Replicas wanted."),
    as_json: bool = _JSON,
) -> None:
    """Run N replicas (within MIN..MAX for an autoscaled service).

    A replica less is drained first: it takes no new request and ends once its
    requests are answered.

    \b
    Examples:
      gpusched service scale web 3
    """
    _print(Client().call("service", action="scale", name=name, replicas=replicas), as_json)


@app.command()
@with_options(JOB_OPTIONS)
def update(
    name: str = _NAME,
    command: list[str] | None = _COMMAND,
    replicas: str | None = typer.Option(None, "--replicas", "-r", help=_REPLICAS_HELP),
    as_json: bool = _JSON,
    **options: Any,
) -> None:
    """Replace every replica, one at a time (a rolling update).

    A new replica passes its health check before an old one is drained and stopped;
    where the GPUs have no room for one more, an old one goes first. The new replicas
    run COMMAND if one is given, with the job options given; all else stays as the
    service has it (--gpus, directory, environment; --env adds to it).

    \b
    Examples:
      gpusched service update chat -- python jobs/serve.py --layers 6
      gpusched service update chat --gpus 2
      gpusched service update chat --replicas 2:6
    """
    spec: dict[str, Any] = replicas_spec(replicas) if replicas else {}
    spec.update(job_changes(list(command or []), options, name))
    _print(Client().call("service", action="update", name=name, spec=spec), as_json)


@app.command()
def delete(name: str = _NAME, as_json: bool = _JSON) -> None:
    """Stop a service: its replicas are cancelled, its front door closes.

    \b
    Examples:
      gpusched service delete web
    """
    result = Client().call("service", action="delete", name=name)
    if as_json:
        print_json(result)
        return
    out.print(
        f"deleted service {name}; cancelled replica jobs: "
        f"{', '.join(map(str, result['stopped_jobs'])) or 'none'}"
    )


def _print(shown: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(shown)
        return
    out.print(details(shown))
