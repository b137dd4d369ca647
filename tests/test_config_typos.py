"""A mistyped config key or section names the one it most likely meant."""

from __future__ import annotations

import pytest

from gpusched.core.config import settings_from_mapping
from gpusched.core.configkeys import KEYS
from gpusched.core.errors import ConfigError

# (config text, the error after the file's path)
TYPOS = [
    ("[host]\ncpu = 4\n", "; did you mean 'host.cpus'?"),
    ("[hots]\ncpus = 4\n", "; did you mean [host]?"),
    ('[scheduler]\npolicy = "spread"\n', "; did you mean [scheduling]?"),
    ('[daemon]\nsimulate = "2x40GiB"\n', "; did you mean 'gpus.simulate'?"),  # wrong section
    ('[host]\nreserved_mem = "1G"\n', "; did you mean 'host.reserve_mem'?"),
]


@pytest.mark.parametrize("text, expected", TYPOS, ids=[t for t, _ in TYPOS])
def test_a_mistyped_key_or_section_suggests_the_near_one(home, text, expected):
    config = home.path / "gpusched.toml"
    config.write_text(text)
    proc = home.run("ls", check=False)
    assert proc.returncode == 1
    # The daemon `ls` starts refuses the file, and the client says why.
    assert proc.stderr.startswith("Error: the gpusched daemon could not start: unknown ")
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.endswith(f" in {config}{expected}\n"), proc.stderr
    assert "Known keys" not in proc.stderr


def test_the_valid_keys_are_listed_only_when_nothing_is_near(home):
    config = home.path / "gpusched.toml"
    config.write_text("[daemon]\nfrobnicate = 1\n")
    proc = home.run("ls", check=False)
    assert proc.returncode == 1
    assert proc.stderr == (
        f"Error: the gpusched daemon could not start: unknown key "
        f"'daemon.frobnicate' in {config}. Known keys: {', '.join(KEYS)}\n"
    )


def test_a_key_outside_any_section_says_where_it_belongs():
    with pytest.raises(ConfigError) as info:
        settings_from_mapping({"cpus": 4}, "gpusched.toml")
    assert info.value.message == (
        "'cpus' in gpusched.toml is outside any section; did you mean cpus under [host]?"
    )
