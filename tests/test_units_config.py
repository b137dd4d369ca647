"""Sizes and durations as people write them, and the config: defaults, TOML, errors, example."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.client.paths import ensure_private_dir, resolve_paths
from gpusched.core import configkeys
from gpusched.core.config import Settings, example_toml, load_settings, settings_from_mapping
from gpusched.core.errors import ConfigError
from gpusched.core.units import duration_human, parse_duration, parse_size, size_human

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
GiB = 2**30


# -- sizes ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("20G", 20 * GiB),
        ("20GiB", 20 * GiB),
        ("20gib", 20 * GiB),
        ("20 GiB", 20 * GiB),
        (" 20G ", 20 * GiB),
        ("20GB", 20 * 10**9),
        ("512MiB", 512 * 2**20),
        ("512M", 512 * 2**20),
        ("1.5T", int(1.5 * 2**40)),
        ("2TB", 2 * 10**12),
        ("1K", 1024),
        ("1KB", 1000),
        ("1024", 1024),
        ("1024B", 1024),
        ("0", 0),
        (1024, 1024),
        (0, 0),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text", ["12XB", "", "G", "-5G", "1e3", "20 G B", "1.2.3G", "GiB20", "ten", True, -1]
)
def test_parse_size_refuses_and_names_the_value(text):
    with pytest.raises(ValueError) as info:
        parse_size(text)
    assert str(text) in str(info.value)


# Up to 1 PiB, the most a job may declare (the daemon's cap); beyond 2**53 the float
# arithmetic in parse_size rounds, which no GPU comes near.
@given(st.integers(min_value=0, max_value=2**50))
def test_parse_size_of_plain_bytes_is_exact(n):
    assert parse_size(str(n)) == parse_size(f"{n}B") == parse_size(n) == n


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["K", "M", "G", "T"]))
def test_binary_units_agree_with_their_long_names(n, unit):
    assert (
        parse_size(f"{n}{unit}")
        == parse_size(f"{n}{unit}iB")
        == n * 2 ** (10 * "KMGT".index(unit) + 10)
    )


@pytest.mark.parametrize(
    "num_bytes, text",
    [
        (None, "N/A"),
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (20 * GiB, "20.0 GiB"),
        (int(12.34 * GiB), "12.3 GiB"),
        (512 * 2**20, "512.0 MiB"),
        (3 * 2**40, "3.0 TiB"),
        (5000 * 2**40, "5000.0 TiB"),
    ],
)
def test_size_human(num_bytes, text):
    assert size_human(num_bytes) == text


@given(st.integers(min_value=1, max_value=1023))
def test_size_human_reads_back_to_the_same_gib(n):
    text = size_human(n * GiB)
    assert text == f"{n}.0 GiB"
    assert parse_size(text.replace(" ", "")) == n * GiB


# -- durations -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90", 90.0),
        ("1.5", 1.5),
        ("2h30m", 9000.0),
        ("45s", 45.0),
        ("1d", 86400.0),
        ("1d2h3m4s", 93784.0),
        ("0.5s", 0.5),
        (" 10M ", 600.0),
        (30, 30.0),
        (2.5, 2.5),
        ("0", 0.0),
        ("200ms", 0.2),
        ("1s500ms", 1.5),
        ("2m", 120.0),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["soon", "5x", "-1", "1h 30m", "h", "", "2h-30m", -3, "1.5.2s", "ms", "200mss", "2sms"]
)
def test_parse_duration_refuses_and_names_the_value(text):
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    assert str(text) in str(info.value)


@pytest.mark.parametrize(
    "seconds, text",
    [
        (None, "-"),
        (0, "0s"),
        (59.9, "59s"),
        (62, "1m02s"),
        (3725, "1h02m"),
        (90061, "1d01h"),
        (-5, "0s"),
    ],
)
def test_duration_human(seconds, text):
    assert duration_human(seconds) == text


@given(st.integers(0, 99), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
def test_duration_parts_add_up(d, h, m, s):
    assert parse_duration(f"{d}d{h}h{m}m{s}s") == d * 86400 + h * 3600 + m * 60 + s


# -- config loading ------------------------------------------------------------------------
def load(tmp_path: Path, text: str, environ: dict | None = None) -> Settings:
    path = tmp_path / "gpusched.toml"
    path.write_text(text)
    return load_settings(path, environ or {})


def test_defaults_without_a_file(tmp_path):
    assert load_settings(tmp_path / "missing.toml", {}) == Settings()


def test_values_from_the_file(tmp_path):
    settings = load(
        tmp_path,
        '[daemon]\ngpu_poll_interval = "30s"\ncancel_grace = 1.5\n'
        '[gpus]\nvisible_devices = "index"\nmem_headroom = "1GiB"\n'
        "max_util_pct = 50\n[jobs]\nmaster_port_min = 40000\n"
        "master_port_max = 40100\n",
    )
    assert settings == Settings(
        gpu_poll_interval_s=30.0,
        cancel_grace_s=1.5,
        visible_devices="index",
        mem_headroom_bytes=GiB,
        max_util_pct=50.0,
        master_port_min=40000,
        master_port_max=40100,
    )


def test_environment_simulate_wins_over_the_file(tmp_path):
    settings = load(tmp_path, '[gpus]\nsimulate = "1x40GiB"\n', {"GPUSCHED_SIMULATE": "4x80GiB"})
    assert settings.simulate == "4x80GiB"
    assert load(tmp_path, '[gpus]\nsimulate = "1x40GiB"\n').simulate == "1x40GiB"


@pytest.mark.parametrize(
    "text, named",
    [
        ("[daemon]\nfrobnicate = 1\n", "'daemon.frobnicate'"),
        ("[nosuch]\nkey = 1\n", "'nosuch.key'"),
        ("[gpus]\nvisible_devices = 'serial'\n", "'gpus.visible_devices'"),
        ("[gpus]\nmax_util_pct = 150\n", "'gpus.max_util_pct'"),
        ("[gpus]\nmax_util_pct = 'lots'\n", "'gpus.max_util_pct'"),
        ("[gpus]\nmem_headroom = '12XB'\n", "'gpus.mem_headroom'"),
        ("[daemon]\ncancel_grace = 'soon'\n", "'daemon.cancel_grace'"),
        ("[daemon]\ngpu_poll_interval = 0\n", "'daemon.gpu_poll_interval'"),
        ("[jobs]\nmaster_port_min = 80\n", "'jobs.master_port_min'"),
        ("[jobs]\nmaster_port_max = 30000.5\n", "'jobs.master_port_max'"),
        ("[jobs]\nmaster_port_min = 30000\nmaster_port_max = 29000\n", "'jobs.master_port_min'"),
        ("[gpus]\nsimulate = 4\n", "'gpus.simulate'"),
        ("daemon = 3\n", "'daemon'"),
        # The names a submit's environment may have (values.environment), and no others.
        ('[jobs]\nenv = { "A=B" = "x" }\n', "'jobs.env'"),
        ('[jobs]\nenv = { "" = "x" }\n', "'jobs.env'"),
    ],
)
def test_bad_config_names_the_key_and_the_file(tmp_path, text, named):
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    message = info.value.message
    assert named in message
    assert str(tmp_path / "gpusched.toml") in message
    assert "\n" not in message


def test_unknown_key_lists_the_known_ones(tmp_path):
    with pytest.raises(ConfigError) as info:
        load(tmp_path, "[daemon]\npoll = 1\n")
    assert all(key in info.value.message for key in configkeys.KEYS)


def test_invalid_toml_names_the_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load(tmp_path, "[daemon\n")
    assert "not valid TOML" in info.value.message
    assert str(tmp_path / "gpusched.toml") in info.value.message


@pytest.mark.parametrize("make_unreadable", ["directory", "not utf-8"])
def test_unreadable_config_names_the_file(tmp_path, make_unreadable):
    # A directory and undecodable bytes stand in for chmod 000, which root reads anyway.
    path = tmp_path / "gpusched.toml"
    if make_unreadable == "directory":
        path.mkdir()
    else:
        path.write_bytes(b'[daemon]\ncancel_grace = "\xff\xfe"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path, {})
    assert info.value.message.startswith(f"cannot read config {path}")


# -- one set of defaults -------------------------------------------------------------------
def test_the_daemon_and_the_simulator_build_placement_rules_alike():
    # The [gpus] and [scheduling] defaults are placement's own, and policies.placement_rules
    # is the one way from settings to rules, for the daemon and the simulator alike.
    from gpusched.core.sched.placement import BUILTIN_POLICIES, PlacementRules
    from gpusched.core.sched.policies import placement_rules
    from gpusched.sim import simulator

    assert placement_rules(Settings(), {}) == PlacementRules()
    for policy in BUILTIN_POLICIES:
        assert simulator.check_choices(4, policy, "fifo") == placement_rules(
            Settings(policy=policy), {}
        )


def test_the_config_takes_exactly_the_schedulers_disciplines(tmp_path):
    from gpusched.core.sched.queuerules import DISCIPLINES, QueueRules

    assert Settings().discipline == QueueRules().discipline == DISCIPLINES[0]
    path = tmp_path / "gpusched.toml"
    for name in DISCIPLINES:
        path.write_text(f'[scheduling]\ndiscipline = "{name}"\n')
        assert load_settings(path, {}).discipline == name
    path.write_text('[scheduling]\ndiscipline = "lifo"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path, {})
    assert info.value.message.endswith(f"'lifo' is not one of: {', '.join(DISCIPLINES)}")


# -- the example file ----------------------------------------------------------------------
def test_example_file_matches_the_code():
    example = REPO / "gpusched.toml.example"
    assert example.exists(), "gpusched.toml.example is missing: write config.example_toml() to it"
    assert example.read_text(encoding="utf-8") == example_toml(), (
        "gpusched.toml.example is stale: regenerate it from gpusched.core.config.example_toml()"
    )


def test_example_lists_every_key_with_its_default():
    data = tomllib.loads(example_toml())
    listed = {f"{section}.{key}" for section, table in data.items() for key in table}
    assert listed == set(configkeys.KEYS)
    assert settings_from_mapping(data, "example") == Settings()


# -- paths ---------------------------------------------------------------------------------
def test_gpusched_home_holds_everything(tmp_path):
    paths = resolve_paths({"GPUSCHED_HOME": str(tmp_path)})
    # Plain strings: every CLI call builds these, and pathlib would cost each one.
    assert paths.state_dir == str(tmp_path / "state")
    assert paths.socket == str(tmp_path / "run" / "gpusched.sock")
    assert paths.config_file == str(tmp_path / "gpusched.toml")
    assert os.path.dirname(paths.db) == os.path.dirname(paths.lock) == paths.state_dir


def test_xdg_directories(tmp_path):
    paths = resolve_paths(
        {
            "HOME": str(tmp_path),
            "XDG_STATE_HOME": str(tmp_path / "s"),
            "XDG_CONFIG_HOME": str(tmp_path / "c"),
            "XDG_RUNTIME_DIR": str(tmp_path / "r"),
        }
    )
    assert paths.state_dir == str(tmp_path / "s" / "gpusched")
    assert paths.config_file == str(tmp_path / "c" / "gpusched" / "gpusched.toml")
    # The socket sits beside the state's lock: cron (no XDG_RUNTIME_DIR) and a login shell
    # (with it) find one daemon.
    assert paths.run_dir == str(tmp_path / "s" / "gpusched" / "run")
    assert (
        resolve_paths({"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "s")}).socket
        == paths.socket
    )
    fallback = resolve_paths({"HOME": str(tmp_path)})
    assert fallback.state_dir == str(tmp_path / ".local/state/gpusched")
    assert fallback.config_file == str(tmp_path / ".config/gpusched/gpusched.toml")


def test_config_override(tmp_path):
    paths = resolve_paths(
        {"GPUSCHED_HOME": str(tmp_path), "GPUSCHED_CONFIG": str(tmp_path / "x.toml")}
    )
    assert paths.config_file == str(tmp_path / "x.toml")


def test_deep_home_keeps_the_socket_path_under_the_unix_limit(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    paths = resolve_paths({"GPUSCHED_HOME": str(deep)})
    assert len(paths.socket.encode()) < 108
    assert paths.state_dir == str(deep / "state")
    # The client derives the same directory from the same home.
    assert resolve_paths({"GPUSCHED_HOME": str(deep)}).socket == paths.socket
    assert resolve_paths({"GPUSCHED_HOME": str(deep) + "x"}).socket != paths.socket


def test_private_dir_is_0700(tmp_path):
    target = tmp_path / "a" / "b"
    ensure_private_dir(target)
    assert target.stat().st_mode & 0o777 == 0o700
    os.chmod(target, 0o755)
    ensure_private_dir(target)
    assert target.stat().st_mode & 0o777 == 0o700
