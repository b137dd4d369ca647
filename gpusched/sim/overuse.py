"""`simulate --estimates`: who would die of a neighbour's GPU memory over-use, without and with
enforcement, on the replay's placements.

Jobs are placed by what they ask for; each is taken to hold its true peak for its whole run
(an upper bound on collisions). A collision is a job's start that takes the sum of the peaks
on one of its GPUs past the card's memory: an allocation fails there. Without enforcement
the over-users have already taken the memory, so the job that dies is one within its promise
(the newest: it is still allocating), until the rest fit; only when none is left does an
over-user die. With enforcement the over-user (the newest, when several) is stopped instead,
and a job within its promise never dies, since the asks on a GPU fit in its memory. A job
that dies or is stopped leaves all its GPUs and loses the work it had done.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpusched.sim.simulator import GPU_MEM_BYTES, JobResult


@dataclass(frozen=True)
class Outcome:
    """One way of handling collisions: who died or was stopped, and the GPU time lost."""

    within_promise: int  # jobs within their --gpu-mem that died or were stopped
    over_users: int  # jobs past their --gpu-mem that died or were stopped
    lost_gpu_hours: float  # the work those jobs had done (no checkpoints)


@dataclass(frozen=True)
class OveruseReport:
    over_users: int  # jobs whose peak is above their --gpu-mem
    collisions: int  # starts that took a GPU's peaks past its memory
    before: Outcome  # no enforcement: the allocation that fails kills its job
    after: Outcome  # enforcement: the over-user stopped (or requeued) instead


def count(
    asks: Sequence[int | None],
    peaks: Sequence[int],
    results: Sequence[JobResult],
    gpu_mem_bytes: int = GPU_MEM_BYTES,
) -> OveruseReport:
    """The collisions of a replay (asks and peaks per GPU, None: a whole GPU, in the
    results' order), and what they cost without and with enforcement."""
    over = [ask is not None and peak > ask for ask, peak in zip(asks, peaks)]
    before, collisions = _replay(over, peaks, results, gpu_mem_bytes, enforce=False)
    after, _ = _replay(over, peaks, results, gpu_mem_bytes, enforce=True)
    return OveruseReport(sum(over), collisions, before, after)


def _replay(
    over: Sequence[bool],
    peaks: Sequence[int],
    results: Sequence[JobResult],
    gpu_mem_bytes: int,
    enforce: bool,
) -> tuple[Outcome, int]:
    order = sorted(range(len(results)), key=lambda n: (results[n].start_s, n))
    rank = {n: place for place, n in enumerate(order)}  # newest: the highest rank
    live: dict[int, list[int]] = {}  # GPU -> the jobs on it
    gone: set[int] = set()
    collisions, died, lost_gpu_s = 0, [0, 0], 0.0  # died: [within their promise, over]
    for n in order:
        now_s = results[n].start_s
        for gpu in results[n].gpu_indices:
            on = [m for m in live.get(gpu, []) if m not in gone and results[m].end_s > now_s]
            live[gpu] = [*on, n]
        for gpu in results[n].gpu_indices:
            on = [m for m in live[gpu] if m not in gone]
            if sum(peaks[m] for m in on) > gpu_mem_bytes:
                collisions += 1
            while on and sum(peaks[m] for m in on) > gpu_mem_bytes:
                # Without enforcement, the jobs within their promise go first; with it, the over-users.
                first = [m for m in on if over[m] == enforce] or on
                victim = max(first, key=rank.__getitem__)
                gone.add(victim)
                on.remove(victim)
                died[over[victim]] += 1
                lost_gpu_s += (now_s - results[victim].start_s) * results[victim].num_gpus
    return Outcome(died[0], died[1], lost_gpu_s / 3600), collisions
