#!/usr/bin/env bash
# Real-GPU check for the NVML backend: run from the repository root on a machine with an
# NVIDIA GPU and driver. It only READS GPU state (nvidia-smi --query-*, NVML reads); it
# never changes a setting (no -pm, -mig, -lgc, -pl, -c, -r ...).
#
#   bench/gpu_check.sh                  # results on stdout and in ${OUT:-.}/gpu_check.txt
#   GPU_CHECK_VENV=/tmp/v bench/gpu_check.sh
#
# Steps: (0) a venv (with the system's site packages, so a preinstalled torch is reused
# offline) with gpusched installed; (1) NvmlBackend().read() against nvidia-smi, field by
# field, while a torch process holds 1 GiB so that the process lists have something in
# them; (2) a job through an isolated daemon: placement, CUDA_VISIBLE_DEVICES, memory
# seen by NVML while it runs, its log and its exit status; (3) MIG rows and the topology
# matrix against nvidia-smi -L, nvidia-smi topo -m and NVML's own calls (no MIG: said so;
# one GPU: a 1x1 matrix); (4) NVIDIA MPS (memory.mps): two torch jobs share GPU 0 under
# gpusched's own MPS control daemon, and the one that allocates past its --gpu-mem fails
# alone (SKIP where nvidia-cuda-mps-control is missing). GPU_CHECK_STEPS="2 4" runs only
# those steps (default: all). Exits 1 if any check FAILs.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPORT="${OUT:-.}/gpu_check.txt"
VENV="${GPU_CHECK_VENV:-$(mktemp -d /tmp/gpu_check_venv.XXXXXX)}"
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
HOLDER_PID=""
DAEMON_HOME=""

cleanup() {
    if [[ -n "$HOLDER_PID" ]]; then kill "$HOLDER_PID" 2>/dev/null || true; fi
    if [[ -n "$DAEMON_HOME" ]]; then
        GPUSCHED_HOME="$DAEMON_HOME" "$VENV/bin/gpusched" daemon stop >/dev/null 2>&1 || true
        if [[ -d "$DAEMON_HOME/run/mps" ]]; then  # a check cut short: its MPS control daemon
            echo quit | CUDA_MPS_PIPE_DIRECTORY="$DAEMON_HOME/run/mps" nvidia-cuda-mps-control \
                >/dev/null 2>&1 || true
        fi
        rm -rf "$DAEMON_HOME"
    fi
    rm -rf "$WORK"
}

section() { printf '\n== %s\n' "$*"; }

make_venv() {
    python3 -m venv --system-site-packages "$VENV"
    # Where python3 is itself a venv (as where torch comes preinstalled), the new venv's
    # "system" packages are the base interpreter's: add python3's own, after the venv's.
    local outer inner
    outer=$(python3 -c 'import site; print("\n".join(site.getsitepackages()))')
    inner=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '%s\n' "$outer" >"$inner/_gpu_check_outer.pth"
}

install_gpusched() {
    section "0. environment"
    [[ -x "$VENV/bin/python" ]] || make_venv
    local py="$VENV/bin/python"
    echo "venv: $VENV"
    if ! "$py" -m pip install -q --retries 1 --timeout 15 -e "$REPO[test]"; then
        # No index reachable: use what the system has (typer, rich, psutil, nvidia-ml-py...).
        echo "pip could not reach an index; installing gpusched alone (--no-deps)"
        "$py" -m pip install -q --no-deps --no-build-isolation -e "$REPO"
    fi
    "$py" -c 'import torch' 2>/dev/null || "$py" -m pip install -q torch
    "$py" - <<'EOF'
import pynvml, torch, gpusched
print(f"gpusched {gpusched.__version__}, nvidia-ml-py {getattr(pynvml, '__version__', '?')}, "
      f"torch {torch.__version__} (cuda {torch.version.cuda}, available: {torch.cuda.is_available()})")
EOF
    nvidia-smi --query-gpu=driver_version,name --format=csv,noheader
}

# Holds 1 GiB on GPU 0 so that both process lists have an entry to compare.
start_memory_holder() {
    "$VENV/bin/python" -c '
import time, torch
x = torch.empty(2**30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
print("ready", flush=True); time.sleep(120)' >"$WORK/holder.out" 2>&1 &
    HOLDER_PID=$!
    for _ in $(seq 1 120); do
        grep -q ready "$WORK/holder.out" 2>/dev/null && return 0
        kill -0 "$HOLDER_PID" 2>/dev/null || break
        sleep 0.5
    done
    echo "the 1 GiB holder did not start:"; cat "$WORK/holder.out"
    return 1
}

compare_with_nvidia_smi() {
    section "1. NvmlBackend().read() vs nvidia-smi (holder pid $HOLDER_PID)"
    nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used,utilization.gpu,temperature.gpu,power.draw,power.limit,enforced.power.limit \
        --format=csv,noheader,nounits >"$WORK/gpus.csv"
    nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits \
        >"$WORK/apps.csv"
    "$VENV/bin/python" - "$WORK/gpus.csv" "$WORK/apps.csv" <<'EOF'
import sys
from gpusched.gpus.nvml import NvmlBackend

MIB = 2**20
backend = NvmlBackend()
inv = backend.read()
backend.close()
print(f"backend={inv.backend} driver={inv.driver_version} cuda={inv.cuda_version} "
      f"problem={inv.problem!r}")
failures = 0

def cell(text):
    text = text.strip()
    return None if text.startswith("[") or text in ("", "N/A") else text

def check(gpu, field, ours, smi, ok):
    global failures
    verdict = "PASS" if ok else "FAIL"
    failures += not ok
    print(f"{gpu:>4} {field:<14} {str(ours):<42} {str(smi):<42} {verdict}")

def near(ours, smi, tol):
    if ours is None or smi is None:
        return ours is None and smi is None
    return abs(float(ours) - float(smi)) <= tol

rows = [[cell(c) for c in line.split(",")] for line in open(sys.argv[1]) if line.strip()]
by_index = {g.index: g for g in inv.gpus}
print(f"{'gpu':>4} {'field':<14} {'gpusched (NVML)':<42} {'nvidia-smi':<42} result")
check("all", "gpu count", len(inv.gpus), len(rows), len(inv.gpus) == len(rows))
for index, uuid, name, bus, total, used, util, temp, power, limit, enforced in rows:
    gpu = by_index.get(int(index))
    if gpu is None:
        check(index, "present", None, uuid, False)
        continue
    check(index, "healthy", gpu.is_healthy, gpu.health_reason or "-", gpu.is_healthy)
    check(index, "uuid", gpu.uuid, uuid, gpu.uuid == uuid)
    check(index, "name", gpu.name, name, gpu.name == name)
    check(index, "bus_id", gpu.bus_id, bus, (gpu.bus_id or "").upper() == (bus or "").upper())
    check(index, "mem total MiB", gpu.mem_total_bytes // MIB, total,
          near(gpu.mem_total_bytes // MIB, total, 1))
    used_mib = None if gpu.mem_used_bytes is None else gpu.mem_used_bytes // MIB
    # Other processes may allocate between the two reads: 64 MiB plus 1%.
    check(index, "mem used MiB", used_mib, used,
          near(used_mib, used, 64 + 0.01 * gpu.mem_total_bytes / MIB))
    check(index, "util %", gpu.util_pct, util, near(gpu.util_pct, util, 10))
    check(index, "temp C", gpu.temperature_c, temp, near(gpu.temperature_c, temp, 3))
    # Power moves from sample to sample: 15 W or 10%.
    check(index, "power W", gpu.power_w, power,
          near(gpu.power_w, power, max(15.0, 0.1 * float(power or 0))))
    check(index, "power limit W", gpu.power_limit_w, enforced or limit,
          near(gpu.power_limit_w, enforced or limit, 1))
    print(f"{index:>4} {'capability':<14} {str(gpu.compute_capability):<42} "
          f"{'(not in --query-gpu)':<42} info")
    for mig in gpu.mig_devices:
        print(f"{index:>4} {'MIG device':<14} {mig.label} {mig.uuid} {mig.mem_total_bytes // MIB} MiB")

ours = {}
for gpu in inv.gpus:
    for device in gpu.mig_devices or (gpu,):
        for proc in device.processes:
            ours[(proc.pid, device.uuid)] = proc
apps = [[cell(c) for c in line.split(",")] for line in open(sys.argv[2]) if line.strip()]
smi = {(int(pid), uuid): used for pid, uuid, used in apps}
for key in sorted(set(ours) | set(smi)):
    proc = ours.get(key)
    ours_mib = None if proc is None or proc.used_mem_bytes is None else proc.used_mem_bytes // MIB
    label = f"pid {key[0]}"
    if proc is not None:
        label += f" {proc.user or '?'} visible={proc.is_visible}"
    check("app", label[:14], f"{ours_mib} MiB on {key[1][:28]}",
          "absent" if key not in smi else f"{smi[key]} MiB",
          key in ours and key in smi and near(ours_mib, smi[key], 16))
print(f"\nfield checks failed: {failures}")
sys.exit(1 if failures else 0)
EOF
}

field() { "$VENV/bin/python" -c 'import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2]))' "$@"; }

run_job_through_daemon() {
    section "2. a 2 GiB torch job through an isolated daemon"
    DAEMON_HOME=$(mktemp -d /tmp/gpusched_home.XXXXXX)
    export GPUSCHED_HOME="$DAEMON_HOME"
    unset GPUSCHED_SIMULATE  # the point is the real GPUs
    local gs="$VENV/bin/gpusched" py="$VENV/bin/python" failures=0
    "$gs" daemon start
    "$gs" gpus || true
    local job='import os, time, torch
print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", ""), flush=True)
print("device_count=%d" % torch.cuda.device_count(), flush=True)
x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
print("allocated_bytes=%d" % x.numel(), flush=True)
time.sleep(5)'
    "$gs" submit --json --gpus 1 --gpu-mem 4G --wait -- "$py" -c "$job" >"$WORK/submit.json" &
    local submit_pid=$! id="" state="" rc=0
    for _ in $(seq 1 120); do  # the id comes first, then --wait blocks
        id=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' \
             "$WORK/submit.json" 2>/dev/null || true)
        [[ -n "$id" ]] && break
        sleep 0.25
    done
    [[ -n "$id" ]] || { echo "FAIL submit printed no job id"; wait "$submit_pid" || true; return 1; }
    echo "job $id submitted"
    for _ in $(seq 1 480); do  # torch start-up can take a while
        "$gs" show "$id" --json >"$WORK/show.json"
        state=$(field "$WORK/show.json" state)
        [[ "$state" == running && $(grep -c allocated_bytes "$(field "$WORK/show.json" stdout_path)" \
            2>/dev/null || true) -gt 0 ]] && break
        [[ "$state" == pending || "$state" == running ]] || break
        sleep 0.25
    done
    local placed
    placed=$("$py" -c 'import json,sys; print(",".join(json.load(open(sys.argv[1]))["gpus"]))' \
             "$WORK/show.json")
    echo "state while running: $state, placed on: $placed"
    # What NVML sees of the running job on the GPU it was given.
    "$py" - "$placed" <<'EOF' || failures=$((failures + 1))
import sys
from gpusched.gpus.nvml import NvmlBackend
placed = sys.argv[1]
backend = NvmlBackend()
inv = backend.read()
backend.close()
devices = {d.uuid: d for g in inv.gpus for d in (g.mig_devices or (g,))}
device = devices.get(placed)
held = [p for p in (device.processes if device else ()) if (p.used_mem_bytes or 0) >= 2 * 2**30]
print(f"{'PASS' if device else 'FAIL'} placed GPU {placed} is one NVML lists")
print(f"{'PASS' if held else 'FAIL'} NVML sees a process holding >= 2 GiB there: "
      f"{[(p.pid, p.used_mem_bytes, p.user, p.command) for p in held]}")
sys.exit(0 if device and held else 1)
EOF
    wait "$submit_pid" || rc=$?
    "$gs" show "$id" --json >"$WORK/show.json"
    "$gs" logs "$id" >"$WORK/job.log" 2>&1 || true
    echo "--- job $id log"; cat "$WORK/job.log"; echo "---"
    verdict() { if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi; }
    verdict "submit --wait exit status is 0 (was $rc)" '[[ $rc -eq 0 ]]'
    verdict "job state succeeded, exit code 0" \
        '[[ $(field "$WORK/show.json" state) == succeeded && $(field "$WORK/show.json" exit_code) == 0 ]]'
    verdict "one GPU placed ($placed)" '[[ -n "$placed" && "$placed" != *,* ]]'
    verdict "CUDA_VISIBLE_DEVICES is the placed GPU's UUID" \
        'grep -qx "CUDA_VISIBLE_DEVICES=$placed" "$WORK/job.log"'
    verdict "torch saw exactly one device" 'grep -qx "device_count=1" "$WORK/job.log"'
    verdict "the job allocated 2 GiB" 'grep -qx "allocated_bytes=2147483648" "$WORK/job.log"'
    local peak
    peak=$(field "$WORK/show.json" gpu_mem_peak_bytes)
    if [[ "$peak" == None ]]; then
        echo "SKIP gpu_mem_peak_bytes is not in show --json in this version"
    else
        verdict "recorded GPU memory peak >= 2 GiB (was $peak)" '[[ $peak -ge 2147483648 ]]'
    fi
    "$gs" daemon stop
    rm -rf "$DAEMON_HOME"
    DAEMON_HOME=""
    echo "job checks failed: $failures"
    return "$failures"
}

compare_mig_and_topology() {
    section "3. MIG rows and topology vs nvidia-smi -L / topo -m"
    nvidia-smi -L >"$WORK/smi_list.txt"
    nvidia-smi topo -m >"$WORK/smi_topo.txt" 2>&1 || echo "(nvidia-smi topo -m failed)" >>"$WORK/smi_topo.txt"
    cat "$WORK/smi_list.txt" "$WORK/smi_topo.txt"
    "$VENV/bin/python" "$REPO/bench/gpu_topology_check.py" "$WORK/smi_list.txt" "$WORK/smi_topo.txt"
    GPUSCHED_HOME=$(mktemp -d /tmp/gpusched_home.XXXXXX) bash -c '
        unset GPUSCHED_SIMULATE; gs="$1"
        "$gs" daemon start >/dev/null && "$gs" gpus && "$gs" gpus --topology
        "$gs" daemon stop >/dev/null; rm -rf "$GPUSCHED_HOME"' _ "$VENV/bin/gpusched"
}

# Two jobs on GPU 0, each promising 2 GiB, under MPS: A holds 512 MiB and waits; B asks
# for 3 GiB, past its limit, and must fail with CUDA out of memory while A goes on and
# allocates more. The control daemon is gpusched's (its own pipe directory) and quits with
# the daemon. It changes no GPU setting (no compute mode): MPS works in the default mode.
check_mps() {
    section "4. NVIDIA MPS: a job past its --gpu-mem fails alone"
    if ! command -v nvidia-cuda-mps-control >/dev/null; then
        echo "SKIP nvidia-cuda-mps-control is not installed"
        return 0
    fi
    DAEMON_HOME=$(mktemp -d /tmp/gpusched_home.XXXXXX)
    export GPUSCHED_HOME="$DAEMON_HOME"
    unset GPUSCHED_SIMULATE
    printf '[memory]\nmps = true\n' >"$DAEMON_HOME/gpusched.toml"
    local gs="$VENV/bin/gpusched" py="$VENV/bin/python" failures=0 go="$WORK/mps_go"
    "$gs" daemon start
    local holder='import os, sys, time, torch
print("limit=" + os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", ""), flush=True)
x = torch.empty(2**29, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
print("holding", flush=True)
while not os.path.exists(sys.argv[1]): time.sleep(0.1)
y = torch.empty(2**29, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
print("allocated more after the neighbour failed", flush=True)'
    local grower='import torch
try:
    x = torch.empty(3 * 2**30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
    print("allocated 3 GiB past a 2 GiB limit", flush=True)
except RuntimeError as exc:
    print("out of memory: %s" % str(exc).splitlines()[0], flush=True)
    raise SystemExit(3)'
    local a b
    a=$("$gs" submit --gpus 1 --gpu-ids 0 --gpu-mem 2G -- "$py" -c "$holder" "$go")
    for _ in $(seq 1 480); do
        grep -q holding "$("$gs" show "$a" --json | "$py" -c 'import json,sys; print(json.load(sys.stdin)["stdout_path"])')" 2>/dev/null && break
        sleep 0.25
    done
    "$gs" gpus --json >"$WORK/mps_gpus.json"
    "$gs" daemon status
    "$gs" daemon status --json >"$WORK/mps_status.json"
    b=$("$gs" submit --gpus 1 --gpu-ids 0 --gpu-mem 2G -- "$py" -c "$grower")
    "$gs" wait "$b" >/dev/null 2>&1 || true
    touch "$go"
    "$gs" wait "$a" >/dev/null 2>&1 || true
    "$gs" show "$a" --json >"$WORK/mps_a.json"
    "$gs" show "$b" --json >"$WORK/mps_b.json"
    "$gs" logs "$a" >"$WORK/mps_a.log" 2>&1 || true
    "$gs" logs "$b" >"$WORK/mps_b.log" 2>&1 || true
    echo "--- job $a (holder)"; cat "$WORK/mps_a.log"; echo "--- job $b (grower)"; cat "$WORK/mps_b.log"; echo "---"
    local control_pid
    control_pid=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["mps"]["pid"] or "")' \
                  "$WORK/mps_status.json")
    verdict() { if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi; }
    verdict "gpusched started its MPS control daemon (pid ${control_pid:-none})" '[[ -n "$control_pid" ]]'
    verdict "the holder's limit is 0=2048M" 'grep -qx "limit=0=2048M" "$WORK/mps_a.log"'
    verdict "gpus --json says GPU 0 is under MPS" \
        '"$py" -c "import json,sys; sys.exit(not json.load(open(sys.argv[1]))[\"gpus\"][0][\"mps\"])" "$WORK/mps_gpus.json"'
    verdict "the grower failed with CUDA out of memory" \
        '[[ $(field "$WORK/mps_b.json" exit_code) == 3 ]] && grep -q "out of memory" "$WORK/mps_b.log"'
    verdict "the holder succeeded, and allocated more after" \
        '[[ $(field "$WORK/mps_a.json" state) == succeeded ]] && grep -q "allocated more" "$WORK/mps_a.log"'
    "$gs" daemon stop
    local gone=1
    for _ in $(seq 1 40); do
        [[ -n "$control_pid" ]] && kill -0 "$control_pid" 2>/dev/null || { gone=0; break; }
        sleep 0.25
    done
    verdict "the control daemon quit with the daemon" '[[ $gone -eq 0 ]]'
    rm -rf "$DAEMON_HOME"
    DAEMON_HOME=""
    echo "MPS checks failed: $failures"
    return "$failures"
}

step() { [[ " ${GPU_CHECK_STEPS:-1 2 3 4} " == *" $1 "* ]]; }

main() {
    local failed=0
    trap cleanup EXIT  # main runs in the pipeline's subshell, which holds the pids
    install_gpusched
    if step 1; then
        start_memory_holder
        compare_with_nvidia_smi || failed=1
        kill "$HOLDER_PID" 2>/dev/null || true
        wait "$HOLDER_PID" 2>/dev/null || true
        HOLDER_PID=""
    fi
    if step 2; then run_job_through_daemon || failed=1; fi
    if step 3; then compare_mig_and_topology || failed=1; fi
    if step 4; then check_mps || failed=1; fi
    section "result: $([[ $failed -eq 0 ]] && echo PASS || echo FAIL)"
    return "$failed"
}

mkdir -p "$(dirname "$REPORT")"
main "$@" 2>&1 | tee "$REPORT"
