"""`gpusched gpus --query`: nvidia-smi's --query-gpu fields and CSV format, for scripts."""

from __future__ import annotations

from gpusched.cli.cmdoptions import GPUS_DEFAULT_QUERY
from gpusched.core.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the fast command path
    from collections.abc import Callable
    from typing import Any

_MIB = 2**20


def _mib(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda g: None if g.get(key) is None else g[key] // _MIB


def _free_mib(gpu: dict[str, Any]) -> int | None:
    if gpu.get("mem_used_bytes") is None:
        return None
    free: int = (gpu["mem_total_bytes"] - gpu["mem_used_bytes"]) // _MIB
    return free


# nvidia-smi's field name -> (value from a `gpus` row, unit shown unless "nounits").
FIELDS: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    # A number, as in nvidia-smi; a MIG device has its GPU's, and its own label (0/2).
    "index": (lambda g: g["index"], ""),
    "label": (lambda g: g["label"], ""),
    "uuid": (lambda g: g["uuid"], ""),
    "name": (lambda g: g["name"], ""),
    "pci.bus_id": (lambda g: g.get("bus_id"), ""),
    "memory.total": (_mib("mem_total_bytes"), " MiB"),
    "memory.used": (_mib("mem_used_bytes"), " MiB"),
    "memory.free": (_free_mib, " MiB"),
    "memory.reserved": (_mib("mem_reserved_bytes"), " MiB"),  # gpusched's promise, not NVML's
    "utilization.gpu": (
        lambda g: None if g.get("util_pct") is None else round(g["util_pct"]),
        " %",
    ),
    "temperature.gpu": (lambda g: g.get("temperature_c"), ""),
    "power.draw": (lambda g: g.get("power_w"), " W"),
    "power.limit": (lambda g: g.get("power_limit_w"), " W"),
    "compute_cap": (
        lambda g: (
            ".".join(map(str, g["compute_capability"])) if g.get("compute_capability") else None
        ),
        "",
    ),
    "health": (lambda g: "ok" if g["healthy"] else (g.get("health_reason") or "lost"), ""),
    "jobs": (lambda g: " ".join(str(j) for j in g["jobs"]), ""),
    # MIG, as nvidia-smi's mig.mode.current; a MIG device's own fields are N/A elsewhere.
    "mig.mode.current": (
        lambda g: None if g.get("parent_uuid") else "Enabled" if g.get("mig_mode") else "Disabled",
        "",
    ),
    "mig.profile": (lambda g: g.get("mig_profile"), ""),
    "mig.parent_uuid": (lambda g: g.get("parent_uuid"), ""),
    "mig.gpu_instance_id": (lambda g: g.get("gpu_instance_id"), ""),
    "mig.compute_instance_id": (lambda g: g.get("compute_instance_id"), ""),
    "numa_node": (lambda g: g.get("numa_node"), ""),
}
FORMATS = ("csv", "json")
DEFAULT_QUERY = GPUS_DEFAULT_QUERY


def parse_query(query: str) -> list[str]:
    fields = [f.strip() for f in query.split(",") if f.strip()]
    unknown = [f for f in fields if f not in FIELDS]
    if not fields or unknown:
        raise UsageError(
            f"unknown --query field {unknown[0] if unknown else query!r}; "
            f"choose from: {', '.join(FIELDS)}"
        )
    return fields


def render(rows: list[dict[str, Any]], fields: list[str], fmt: str) -> str:
    """fmt: 'json', or 'csv' with nvidia-smi's modifiers: 'csv,noheader,nounits'."""
    kind, *modifiers = [m.strip() for m in fmt.split(",")]
    if kind not in FORMATS or not set(modifiers) <= {"noheader", "nounits"}:
        raise UsageError(f"--format {fmt!r}: use json, or csv with noheader and/or nounits")
    if kind == "json":
        import json  # noqa: PLC0415 - 16 ms (re) of every `gpus`: only for this format

        return json.dumps([{f: FIELDS[f][0](g) for f in fields} for g in rows], indent=2) + "\n"
    # Exactly nvidia-smi's shape (", " between fields, no quoting), so that scripts which
    # split its output keep working.
    units = "nounits" not in modifiers
    lines = []
    if "noheader" not in modifiers:
        lines.append(
            ", ".join(
                f + (f" [{FIELDS[f][1].strip()}]" if units and FIELDS[f][1] else "") for f in fields
            )
        )
    for gpu in rows:
        lines.append(
            ", ".join(_cell(FIELDS[f][0](gpu), FIELDS[f][1] if units else "") for f in fields)
        )
    return "".join(line + "\n" for line in lines)


def _cell(value: Any, unit: str) -> str:
    return "[N/A]" if value is None else f"{value}{unit}"
