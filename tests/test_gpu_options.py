"""`--gpu-ids` on its own, GPU ids that do not exist, and `gpus --format` for scripts."""

from __future__ import annotations

import json

from gpusched.cli.views.gpuquery import parse_query, render

MIXED = "2xH100-80GiB,2xA100-40GiB"
# What `gpus --format` prints without `--query`: the README and `gpus --help` say so.
DEFAULT_FIELDS = (
    "index, uuid, name, memory.total, memory.used, memory.reserved, utilization.gpu, health, jobs"
)


def test_gpu_ids_alone_asks_for_one_of_those_gpus(make_home):
    home = make_home(MIXED)
    job = home.submit("--gpu-ids", "2", "--", "true")
    done = home.wait_state(job, "succeeded", "failed")
    assert (done["state"], done["gpus_requested"], done["gpu_indices"]) == ("succeeded", 1, [2])
    either = home.wait_state(home.submit("--gpu-ids", "1,3", "--", "true"), "succeeded")
    assert either["gpus_requested"] == 1 and either["gpu_indices"] in ([1], [3])
    both = home.wait_state(
        home.submit("--gpus", "2", "--gpu-ids", "1,3", "--", "true"), "succeeded"
    )
    assert sorted(both["gpu_indices"]) == [1, 3]


def test_a_gpu_id_that_does_not_exist_is_named(make_home):
    home = make_home(MIXED)
    for args in (["--gpu-ids", "7"], ["--gpus", "1", "--gpu-ids", "2,7"]):
        proc = home.run("submit", *args, "--", "true", check=False)
        assert proc.returncode == 2
        assert proc.stderr == (
            f"Error: job asks for --gpu-ids {args[-1]}, but this box has no "
            "GPU 7: it has GPUs 0-3; see `gpusched gpus`\n"
        )
    assert home.jobs() == []


def test_a_constraint_no_gpu_meets_never_says_the_box_has_0(make_home):
    home = make_home(MIXED)
    proc = home.run("submit", "--gpus", "3", "--gpu-type", "A100", "--", "true", check=False)
    assert proc.returncode == 2
    assert "this box has 0" not in proc.stderr
    assert proc.stderr.startswith(
        "Error: job asks for 3 GPUs that meet its constraints; only 2 "
        "of the 4 GPUs here meet them (GPU 0: NVIDIA H100, 80.0 GiB"
    )


def test_gpus_format_without_query_prints_the_documented_default_fields(make_home):
    home = make_home("2x80GiB")
    csv = home.run("gpus", "--format", "csv").stdout.splitlines()
    assert csv[0] == (
        "index, uuid, name, memory.total [MiB], memory.used [MiB], "
        "memory.reserved [MiB], utilization.gpu [%], health, jobs"
    )
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
    rows = [
        {"index": 0, "label": "0/1", "uuid": "MIG-a"},
        {"index": 0, "label": "0/2", "uuid": "MIG-b"},
        {"index": 1, "label": "1", "uuid": "GPU-c"},
    ]
    fields = parse_query("index,label,uuid")
    assert json.loads(render(rows, fields, "json")) == [
        {"index": 0, "label": "0/1", "uuid": "MIG-a"},
        {"index": 0, "label": "0/2", "uuid": "MIG-b"},
        {"index": 1, "label": "1", "uuid": "GPU-c"},
    ]
    assert render(rows, fields, "csv,noheader") == "0, 0/1, MIG-a\n0, 0/2, MIG-b\n1, 1, GPU-c\n"
