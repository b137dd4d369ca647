"""How the GPUs are linked, read through NVML: the `nvidia-smi topo -m` matrix and each GPU's
nearest cores and NUMA node.

The pynvml module is passed in by gpus/nvml.py, which stays its only importer. Every call
may fail on its own (a VM hides the PCIe tree, a GPU without NVLink refuses the NVLink
calls): a failure leaves that part unknown, never the whole reading.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

# nvmlDeviceGetTopologyCommonAncestor's levels as nvidia-smi prints them. A board with
# two GPUs (INTERNAL) shows as PIX: one bridge between them.
_LEVELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_WORD_BITS = 64  # pynvml's affinity arrays are of unsigned long long


def _bus(pci: Any) -> str:
    raw = pci.busId
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
    return text.strip("\x00 ").upper()


def _nvlink_peers(nv: Any, handle: Any) -> list[str]:
    """The PCI bus id at the far end of each active NVLink (a GPU, or an NVSwitch)."""
    peers = []
    for link in range(nv.NVML_NVLINK_MAX_LINKS):
        try:
            if not nv.nvmlDeviceGetNvLinkState(handle, link):
                continue
            peers.append(_bus(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)))
        except nv.NVMLError_NotSupported:
            return peers  # no NVLink at all
        except nv.NVMLError_InvalidArgument:
            return peers  # past this GPU's last link
        except nv.NVMLError:
            continue
    return peers


def _nvlink_label(
    nv: Any,
    handles: Sequence[Any],
    peers: Sequence[list[str]],
    buses: Sequence[str],
    a: int,
    b: int,
) -> str:
    """NV<n>: links straight to the other GPU, else links into NVSwitches that NVML says
    carry peer-to-peer traffic between the two; "" when they are not NVLinked."""
    direct = peers[a].count(buses[b])
    if direct:
        return f"NV{direct}"
    switched = [sum(1 for p in peers[i] if p and p not in buses) for i in (a, b)]
    if not all(switched):
        return ""
    try:
        status = nv.nvmlDeviceGetP2PStatus(handles[a], handles[b], nv.NVML_P2P_CAPS_INDEX_NVLINK)
    except nv.NVMLError:
        return ""
    return f"NV{min(switched)}" if status == nv.NVML_P2P_STATUS_OK else ""


def _pcie_label(nv: Any, handles: Sequence[Any], a: int, b: int) -> str | None:
    try:
        level = nv.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b])
    except nv.NVMLError:
        return None
    return _LEVELS.get(int(level), "SYS")


def read_links(
    nv: Any, handles: Sequence[Any], buses: Sequence[str]
) -> tuple[tuple[str, ...], ...]:
    """The link matrix (core/sched/topology.py); () when NVML cannot tell the PCIe distances.
    `handles` has None for a GPU that is not asked (lost)."""
    if len(handles) < 2:
        return ()
    peers = [[] if h is None else _nvlink_peers(nv, h) for h in handles]
    rows = []
    for a in range(len(handles)):
        row = []
        for b in range(len(handles)):
            if a == b or handles[a] is None or handles[b] is None:
                row.append("X" if a == b else "N/A")  # a lost GPU: never placed anyway
                continue
            label = _nvlink_label(nv, handles, peers, buses, a, b) or _pcie_label(nv, handles, a, b)
            if label is None:
                return ()
            row.append(label)
        rows.append(tuple(row))
    return tuple(rows)


def _bits(words: Any) -> list[int]:
    return [
        w * _WORD_BITS + bit
        for w, word in enumerate(words)
        for bit in range(_WORD_BITS)
        if int(word) >> bit & 1
    ]


def read_affinity(nv: Any, handle: Any) -> tuple[tuple[int, ...], int | None]:
    """(the cores nearest the GPU, its NUMA node), each empty/None when NVML will not say."""
    # Room for 256 cores at least: a word too few would cut the far socket's cores off.
    cpu_words = max((os.cpu_count() or 1) // _WORD_BITS + 1, 4)
    try:
        cpu_ids = tuple(_bits(nv.nvmlDeviceGetCpuAffinity(handle, cpu_words)))
    except nv.NVMLError:
        cpu_ids = ()
    try:
        nodes = _bits(nv.nvmlDeviceGetMemoryAffinity(handle, 1, nv.NVML_AFFINITY_SCOPE_NODE))
    except nv.NVMLError:
        nodes = []
    return cpu_ids, (nodes[0] if len(nodes) == 1 else None)
