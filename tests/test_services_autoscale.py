"""The autoscaling decision (core/services.decide), pure: over a window, with hysteresis, a
cool-down, MIN..MAX and [[service.schedule]] windows; and the service definition's checks."""

from __future__ import annotations

import pytest

from gpusched.core import services as model
from gpusched.core.errors import UsageError
from gpusched.core.services import Autoscale, LoadSample, Service, decide

RULE = Autoscale(target_in_flight=2.0, target_latency_ms=100.0, window_s=30.0, cooldown_s=60.0)
NOON = 12 * 60


def service(wanted: int = 2, low: int = 1, high: int = 4, **changes) -> Service:
    return Service(
        name="web",
        uid=1,
        user="u",
        job={},
        env={},
        cwd="/",
        min_replicas=low,
        max_replicas=high,
        wanted=wanted,
        autoscale=RULE,
        **changes,
    )


def window(
    in_flight: int,
    running: int = 2,
    p95_ms: float | None = None,
    util: float | None = None,
    now: float = 1000.0,
    every_s: float = 1.0,
    span_s: float = 30.0,
) -> list[LoadSample]:
    count = int(span_s / every_s) + 1
    return [
        LoadSample(now - span_s + i * every_s, in_flight, running, p95_ms, util)
        for i in range(count)
    ]


def test_requests_in_flight_over_target_for_the_whole_window_add_one_replica():
    wanted, why = decide(service(), window(in_flight=6), 1000.0, 0.0, NOON)
    assert (wanted, why) == (3, "requests in flight over target")


def test_a_burst_is_not_a_trend():
    samples = window(in_flight=1)
    samples[-1] = LoadSample(1000.0, 50, 2)
    assert decide(service(), samples, 1000.0, 0.0, NOON) == (2, "")


def test_nothing_changes_within_the_cool_down_or_before_the_window_is_covered():
    assert decide(service(), window(in_flight=6), 1000.0, 990.0, NOON) == (2, "")
    assert decide(service(), window(in_flight=6, span_s=5), 1000.0, 0.0, NOON) == (2, "")


def test_never_above_max_nor_below_min():
    assert decide(service(wanted=4), window(in_flight=60), 1000.0, 0.0, NOON) == (4, "")
    assert decide(service(wanted=1), window(in_flight=0, running=1), 1000.0, 0.0, NOON) == (1, "")


def test_p95_latency_or_gpu_utilization_over_target_add_a_replica():
    assert decide(service(), window(in_flight=1, p95_ms=250), 1000.0, 0.0, NOON) == (
        3,
        "p95 latency over target",
    )
    assert decide(service(), window(in_flight=1, util=95), 1000.0, 0.0, NOON) == (
        3,
        "GPU utilization over target",
    )


def test_hysteresis_scales_down_only_well_below_every_target():
    # Half the target: in the band, nothing moves.
    assert decide(service(), window(in_flight=2), 1000.0, 0.0, NOON) == (2, "")
    # Low load, but latency still near its target: nothing moves.
    assert decide(service(), window(in_flight=0, p95_ms=90), 1000.0, 0.0, NOON) == (2, "")
    assert decide(service(), window(in_flight=0, p95_ms=5, util=3), 1000.0, 0.0, NOON) == (
        1,
        "load below target",
    )


def test_a_schedule_window_caps_replicas_even_below_min_and_wraps_midnight():
    night = service(wanted=3, low=2, schedule=model.parse_schedule(["23:00-07:00=1"]))
    assert model.bounds(night, 2 * 60) == (1, 1)
    assert model.bounds(night, 23 * 60 + 30) == (1, 1)
    assert model.bounds(night, NOON) == (2, 4)
    assert decide(night, [], 1000.0, 999.0, 3 * 60) == (1, "schedule")
    # Morning: back to MIN at least, at once.
    assert decide(replace_wanted(night, 1), [], 1000.0, 999.0, 8 * 60) == (2, "minimum")


def replace_wanted(s: Service, wanted: int) -> Service:
    return model.scaled(s, wanted)


def test_p95_is_the_nearest_rank():
    assert model.p95(list(range(1, 101))) == 95
    assert model.p95([]) is None


@pytest.mark.parametrize("text", ["x", "3:1", "-1", "1:99"])
def test_bad_replicas_are_refused(text):
    with pytest.raises(UsageError):
        model.parse_replicas(text)


@pytest.mark.parametrize(
    "bad",
    [
        ("parse_listen", "127.0.0.1:80\nglobal"),
        ("parse_health", "/ok\n  server x"),
        ("parse_health", "healthz"),
        ("parse_schedule", ["7-9=1"]),
        ("parse_weights", "3,0"),
        ("check_name", "Web Server"),
    ],
)
def test_what_goes_into_haproxys_config_is_checked(bad):
    function, value = bad
    with pytest.raises(UsageError):
        getattr(model, function)(value)


def test_a_service_round_trips_through_its_stored_form():
    s = service(weights=(3, 1), schedule=((0, 420, 1),))
    assert Service.from_dict(s.to_dict()) == s
