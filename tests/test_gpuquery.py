"""`gpusched gpus --query`: nvidia-smi's field names and CSV shape, for scripts that switch."""

import json

import pytest

from gpusched.cli.views.gpuquery import parse_query, render
from gpusched.core.errors import UsageError

ROW = {
    "index": 0,
    "label": "0",
    "uuid": "GPU-1",
    "name": "NVIDIA H100",
    "bus_id": "00000000:18:00.0",
    "mem_total_bytes": 80 * 2**30,
    "mem_used_bytes": 2**30,
    "mem_reserved_bytes": 0,
    "util_pct": 37.4,
    "temperature_c": None,
    "power_w": 120.5,
    "power_limit_w": 700.0,
    "compute_capability": [9, 0],
    "healthy": True,
    "health_reason": "",
    "jobs": [3, 4],
}


def test_csv_matches_nvidia_smi_shape_with_header_and_units():
    fields = parse_query("index,name,memory.used,memory.free,utilization.gpu,temperature.gpu")
    assert render([ROW], fields, "csv") == (
        "index, name, memory.used [MiB], memory.free [MiB], utilization.gpu [%], temperature.gpu\n"
        "0, NVIDIA H100, 1024 MiB, 80896 MiB, 37 %, [N/A]\n"
    )


def test_csv_noheader_nounits():
    fields = parse_query("index, power.draw, compute_cap, jobs")
    assert render([ROW], fields, "csv,noheader,nounits") == "0, 120.5, 9.0, 3 4\n"


def test_json_uses_the_field_names():
    assert json.loads(render([ROW], parse_query("uuid,memory.total"), "json")) == [
        {"uuid": "GPU-1", "memory.total": 81920}
    ]


@pytest.mark.parametrize("query", ["", "index,bogus"])
def test_unknown_field_lists_the_valid_ones(query):
    with pytest.raises(UsageError, match="choose from: index, label, uuid"):
        parse_query(query)


def test_bad_format_is_a_usage_error():
    with pytest.raises(UsageError, match="use json, or csv"):
        render([ROW], ["index"], "xml")


def test_gpus_query_end_to_end(make_home):
    home = make_home("2xA100-40GiB")
    out = home.run("gpus", "--query", "index,name,memory.total", "--format", "csv,noheader").stdout
    assert out == "0, NVIDIA A100, 40960 MiB\n1, NVIDIA A100, 40960 MiB\n"
    proc = home.run("gpus", "--query", "index,nope", check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("Error: unknown --query field 'nope'")
