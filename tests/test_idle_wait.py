"""How long the daemon's loop waits for a request when nothing happens: until its next
deadline (the GPU read), so that an idle daemon costs next to no CPU (issue 15), but a
short while when something looks for time to pass on its own (a `wait` with a timeout).
The loop's real wait is on its call queue; here the queue records the timeout it is given."""

from __future__ import annotations

import queue


def waited_s(box) -> float:
    """The timeout of the loop's next wait for a call, with nothing on its queue."""
    asked: list[float] = []

    def get(timeout: float | None = None, block: bool = True):
        asked.append(timeout)
        raise queue.Empty

    box.daemon.calls.queue.get = get
    box.daemon._next_calls()
    return asked[0]


def test_an_idle_loop_waits_until_its_next_gpu_read(make_box):
    box = make_box(config='[daemon]\ngpu_poll_interval = "2s"\n')
    box.step(2.0)  # a turn that reads the GPUs: the next read is 2 s away
    assert waited_s(box) == 2.0
    box.clock.advance(0.5)
    assert waited_s(box) == 1.5


def test_a_long_gpu_poll_interval_still_turns_every_two_seconds(make_box):
    box = make_box(config='[daemon]\ngpu_poll_interval = "30s"\n')
    box.step(30.0)
    assert waited_s(box) == 2.0


def test_a_wait_with_a_timeout_keeps_the_loop_turning_often(box):
    job_id = box.submit("--", "sleep", "60")
    box.step(2.0)
    call = box.send("wait", ids=[job_id], timeout_s=5)
    assert not call.done.is_set()
    assert waited_s(box) == 0.5
