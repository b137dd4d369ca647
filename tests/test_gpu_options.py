"""`gpus --format` for scripts."""

from __future__ import annotations

import json

from gpusched.gpuquery import parse_query, render

# What `gpus --format` prints without `--query`: the README and `gpus --help` say so.
DEFAULT_FIELDS = ("index, uuid, name, memory.total, memory.used, memory.reserved, "
                  "utilization.gpu, health, jobs")


def test_gpus_format_without_query_prints_the_documented_default_fields(make_home):
    home = make_home("2x80GiB")
    csv = home.run("gpus", "--format", "csv").stdout.splitlines()
    assert csv[0] == ("index, uuid, name, memory.total [MiB], memory.used [MiB], "
                      "memory.reserved [MiB], utilization.gpu [%], health, jobs")
    assert [line.split(", ")[0] for line in csv[1:]] == ["0", "1"]
    rows = json.loads(home.run("gpus", "--format", "json").stdout)
    assert [", ".join(row) for row in rows] == [DEFAULT_FIELDS] * 2
    assert [row["index"] for row in rows] == [0, 1]
    assert DEFAULT_FIELDS in " ".join(home.run("gpus", "--help").stdout.split())


def test_gpu_index_is_a_number_in_every_json_form(make_home):
    home = make_home("2x80GiB")
    queried = json.loads(home.run("gpus", "--query", "index,label", "--format", "json").stdout)
    assert queried == [{"index": 0, "label": "0"}, {"index": 1, "label": "1"}]
    listed = home.json("gpus")["gpus"]
    assert [(g["index"], g["label"]) for g in listed] == [(0, "0"), (1, "1")]


def test_a_mig_device_keeps_its_gpus_numeric_index_and_its_own_label():
    # The rows `gpus` sends for a GPU 0 in MIG mode (docs/real-gpus.md): MIG devices carry
    # their GPU's index and a label of their own.
    rows = [{"index": 0, "label": "0/1", "uuid": "MIG-a"}, {"index": 0, "label": "0/2", "uuid": "MIG-b"},
            {"index": 1, "label": "1", "uuid": "GPU-c"}]
    fields = parse_query("index,label,uuid")
    assert json.loads(render(rows, fields, "json")) == [
        {"index": 0, "label": "0/1", "uuid": "MIG-a"}, {"index": 0, "label": "0/2", "uuid": "MIG-b"},
        {"index": 1, "label": "1", "uuid": "GPU-c"}]
    assert render(rows, fields, "csv,noheader") == "0, 0/1, MIG-a\n0, 0/2, MIG-b\n1, 1, GPU-c\n"
