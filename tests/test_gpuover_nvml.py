"""GPU memory promises kept, measured through the real NVML backend on the fake NVML
library (tests/fake_nvml.py) and the daemon's loop in process: on one 80 GiB GPU, A asks
for 10 GiB and grows to 30 GiB while B, which asked for 60 GiB, grows towards its 60."""

from __future__ import annotations

import signal

from fake_nvml import FakeDriver, FakeProcess, fake_nvml, make_gpu
from gpusched.daemon.observe.metrics import make_registry
from gpusched.gpus.nvml import NvmlBackend
from metrics_scrape import scrape_registry

__all__ = ["fake_nvml"]  # the fixture, imported so that pytest finds it here

GIB = 2**30
TOTAL = 80 * GIB
# Each poll, what A and B have allocated (they hold it until they end): A outgrows its
# promise at once; B reaches the 60 GiB it asked for at the last poll.
A_STEPS = (10 * GIB, 20 * GIB, 30 * GIB, 30 * GIB)
B_STEPS = (20 * GIB, 40 * GIB, 45 * GIB, 60 * GIB)


class Scenario:
    """A and B on the fake GPUs (two, so that a requeued job has somewhere to go): each
    poll sets what each running job holds on its GPU, and records an allocation that the
    GPU could not give (what CUDA would fail)."""

    def __init__(self, fake_nvml, make_box, over: str):
        self.gpus = [make_gpu("H100", i, mem_total_bytes=TOTAL) for i in range(2)]
        fake_nvml(FakeDriver(gpus=self.gpus))
        config = f'[memory]\ngpu_over = "{over}"\n[[notify]]\nevents = ["gpu_mem_over"]\n'
        self.box = make_box("", config + 'command = ["true"]\n')  # "": the NVML backend
        assert isinstance(self.box.daemon.backend, NvmlBackend)
        self.events: list[tuple[str, int]] = []
        self.box.daemon.state.notifier.dispatch = lambda rule, event: self.events.append(
            (event["event"], event["job"]["id"])
        )
        self.poll_s = self.box.daemon.settings.gpu_poll_interval_s
        grace = ["--preempt-grace", f"{self.poll_s}s"]  # SIGTERM a poll after the checkpoint
        self.a = self.box.submit("--gpu-mem", "10G", *grace, "--", "python", "a.py")
        self.b = self.box.submit("--gpu-mem", "60G", "--", "python", "b.py")
        self.box.step()
        self.box.step()  # the shims' pids are known
        self.shared = self.box.show(self.a)["gpu_indices"]
        assert self.box.show(self.b)["gpu_indices"] == self.shared  # best fit: one GPU
        self.failed: list[str] = []

    def poll(self, n: int) -> None:
        """The jobs allocate their memory for poll n, then the daemon reads the GPUs."""
        live = self.box.shims.alive
        held: dict[int, dict[int, int]] = {0: {}, 1: {}}  # GPU index -> job id -> bytes
        for job_id, steps in ((self.a, A_STEPS), (self.b, B_STEPS)):
            if job_id in live:
                (index,) = self.box.show(job_id)["gpu_indices"]
                others, wanted = sum(held[index].values()), steps[n]
                if others + wanted > TOTAL:  # CUDA out of memory in this job
                    self.failed.append(f"job {job_id} at poll {n}")
                    wanted = TOTAL - others
                held[index][job_id] = wanted
        for index, gpu in enumerate(self.gpus):
            gpu.processes = [FakeProcess(live[j], used) for j, used in held[index].items()]
            gpu.mem_used_bytes = sum(held[index].values())
        self.box.step(self.poll_s)

    def end_signalled(self) -> None:
        """A job that got SIGTERM ends (its shim records the signal)."""
        for job_id in list(self.box.shims.alive):
            if signal.SIGTERM in self.box.shims.signalled(job_id):
                self.box.shims.exit(job_id, None, signal.SIGTERM)
        self.box.step()


def test_stop_ends_a_within_two_polls_and_b_never_fails_an_allocation(fake_nvml, make_box):
    s = Scenario(fake_nvml, make_box, "stop")
    s.poll(0)
    s.poll(1)  # A at 20 GiB of its 10: the checkpoint signal
    assert s.box.shims.signalled(s.a) == [signal.SIGUSR1]
    s.poll(2)  # the second poll over: SIGTERM
    assert s.box.shims.signalled(s.a) == [signal.SIGUSR1, signal.SIGTERM]
    s.end_signalled()
    s.poll(3)  # B takes its 60 GiB
    assert s.failed == []
    a = s.box.show(s.a)
    assert (a["state"], a["end_reason"]) == (
        "gpu_oom",
        f"stopped: used 20.0 GiB of GPU {s.shared[0]}, asked for 10.0 GiB (gpu_over = stop) "
        "(SIGTERM)",
    )
    assert s.box.states(s.b) == ["running"] and s.box.shims.signalled(s.b) == []


def test_report_gives_the_event_and_the_metric_and_b_then_fails(fake_nvml, make_box):
    s = Scenario(fake_nvml, make_box, "report")
    for n in range(3):
        s.poll(n)
    assert s.events == [("gpu_mem_over", s.a)]
    m = scrape_registry(make_registry(s.box.daemon.state, s.box.daemon.setup))
    assert m.value("gpusched_jobs_gpu_mem_over") == 1
    assert s.box.show(s.a)["gpu_mem_over_by"] == (
        f"used 20.0 GiB of GPU {s.shared[0]}, asked for 10.0 GiB"
    )
    s.poll(3)
    assert s.failed == [f"job {s.b} at poll 3"]  # what `stop` and `requeue` prevent


def test_requeue_runs_a_again_with_37_5_gib_where_it_fits(fake_nvml, make_box):
    s = Scenario(fake_nvml, make_box, "requeue")
    s.poll(0)
    s.poll(1)
    s.poll(2)  # the grace ran out: SIGTERM
    s.end_signalled()
    a = s.box.show(s.a)
    assert (a["state"], a["attempt"], a["gpu_mem_bytes"]) == ("running", 2, 37 * GIB + GIB // 2)
    assert a["gpu_indices"] != s.shared and s.box.show(s.b)["gpu_indices"] == s.shared
    s.poll(3)
    assert s.failed == []
