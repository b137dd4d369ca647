"""Placement rules from the settings, and custom policies from the `gpusched.policies` entry points."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from importlib.metadata import entry_points

from gpusched.core.config import Settings
from gpusched.core.errors import ConfigError
from gpusched.core.models import Request
from gpusched.core.sched.placement import (
    BUILTIN_POLICIES,
    GpuLoad,
    PlacementRules,
    Policy,
    PolicyContext,
    Veto,
)

log = logging.getLogger("gpusched.policies")
ENTRY_POINT_GROUP = "gpusched.policies"


def load_custom_policies() -> dict[str, Policy]:
    """Every installed policy: `name = "module:function"` in the gpusched.policies group.

    One that fails to load is logged and skipped, so a broken plug-in cannot stop the
    daemon unless the config asks for it (then placement_rules names it).
    """
    found: dict[str, Policy] = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in BUILTIN_POLICIES:
            log.warning(
                "policy %r from %s shadows a built-in one; ignored", entry.name, entry.value
            )
            continue
        try:
            policy = entry.load()
        except Exception:
            log.exception("cannot load policy %r (%s)", entry.name, entry.value)
            continue
        if callable(policy):
            found[entry.name] = _guarded(entry.name, policy)
    return found


def _guarded(name: str, policy: Policy) -> Policy:
    """The policy, made safe to call: when it fails it places nothing (a Veto: the job
    waits, saying so), and the daemon, which calls it in every scheduling pass, goes on."""
    reported = False

    def run(request: Request, candidates: Sequence[GpuLoad], ctx: PolicyContext) -> list[GpuLoad]:
        nonlocal reported
        try:
            return [load for load in policy(request, candidates, ctx) if isinstance(load, GpuLoad)]
        except Veto:
            raise
        except Exception as error:
            if not reported:  # every pass would fail alike: one traceback is enough
                log.exception("policy %r failed; jobs that use it wait", name)
                reported = True
            raise Veto(
                f"it failed ({type(error).__name__}; the daemon's log has the traceback)"
            ) from None

    return run


def placement_rules(settings: Settings, custom: dict[str, Policy]) -> PlacementRules:
    names = [*BUILTIN_POLICIES, *custom]
    if settings.policy not in names:
        raise ConfigError(
            f"scheduling.policy: unknown policy {settings.policy!r}; choose one of: "
            f"{', '.join(names)}"
        )
    return PlacementRules(
        max_util_pct=settings.max_util_pct,
        mem_headroom_bytes=settings.mem_headroom_bytes,
        exclusive_idle_mem_bytes=settings.exclusive_idle_mem_bytes,
        policy=settings.policy,
        outside=settings.outside,
        outside_ignore_below_bytes=settings.outside_ignore_below_bytes,
        outside_idle_after_s=settings.outside_idle_after_s,
        gpu_weights=dict(enumerate(settings.gpu_weights)),
        gpu_order=settings.gpu_order,
        custom_policies=custom,
    )
