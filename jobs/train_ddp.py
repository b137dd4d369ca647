"""Data-parallel training of a small MLP on synthetic data: checkpoints, resumes, reports progress.

Run it under torchrun (one process per GPU, NCCL; Gloo on the CPU), e.g. under gpusched:

    gpusched submit --gpus 2 --env TORCHELASTIC_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \
        -- sh -c 'exec torchrun --nproc-per-node=2 --master-port="$MASTER_PORT" jobs/train_ddp.py'

or alone as `python jobs/train_ddp.py` (one process). jobs/README.md explains the idiom.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # gpusched from a checkout
from gpusched import job

EVAL_RANK = 1_000_000


@dataclass(frozen=True)
class World:
    rank: int
    local_rank: int
    size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="Total optimizer steps.")
    parser.add_argument("--batch-size", type=int, default=64, help="Samples per step per rank.")
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--checkpoint-dir",
        default="checkpoints/train_ddp",
        help="Where checkpoint.pt lives; a re-run resumes from it.",
    )
    parser.add_argument(
        "--checkpoint-every", type=int, default=200, help="Steps between checkpoints."
    )
    parser.add_argument(
        "--log-every", type=int, default=100, help="Steps between throughput lines."
    )
    parser.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    parser.add_argument(
        "--eval-only",
        action="store_true",
        help="Evaluate the checkpoint on held-out batches instead of training.",
    )
    parser.add_argument(
        "--max-loss", type=float, help="With --eval-only: exit 1 when the loss is above this."
    )
    return parser.parse_args(argv)


def setup_world(backend: str) -> World:
    """torchrun's RANK/WORLD_SIZE when present; else one process, no process group."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # On the CPU build, or with `--gpus 0` (CUDA_VISIBLE_DEVICES empty), CUDA is unavailable.
    use_cuda = torch.cuda.is_available() and backend != "gloo"
    device = torch.device(f"cuda:{local_rank % torch.cuda.device_count()}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
        job.limit_torch_memory()  # with --gpu-mem: stay within it on a shared GPU
    if "WORLD_SIZE" not in os.environ:
        return World(0, 0, 1, device)
    if backend == "auto":
        backend = "nccl" if use_cuda else "gloo"
    dist.init_process_group(backend=backend)
    return World(dist.get_rank(), local_rank, dist.get_world_size(), device)


class Teacher:
    """The synthetic task: y = tanh(x W) + noise, drawn afresh for each (step, rank).

    Seeding by step makes a resumed run see exactly the batches it would have seen.
    """

    def __init__(self, features: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.weight = torch.randn(features, 1, generator=gen)
        self.features, self.seed = features, seed

    def batch(self, step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 4099 + rank)
        x = torch.randn(size, self.features, generator=gen)
        y = torch.tanh(x @ self.weight) + 0.01 * torch.randn(size, 1, generator=gen)
        return x, y


def build_model(args: argparse.Namespace) -> nn.Module:
    torch.manual_seed(args.seed)
    return nn.Sequential(
        nn.Linear(args.features, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, 1),
    )


def checkpoint_path(args: argparse.Namespace) -> Path:
    return Path(args.checkpoint_dir) / "checkpoint.pt"


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """The step to start from: 0 without a checkpoint."""
    if not path.exists():
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def save_checkpoint(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, step: int
) -> None:
    """Temp file, fsync, rename, fsync the directory: a crash leaves the old or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        torch.save(
            {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, fh
        )
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def agreed_stop_signal(world: World) -> int:
    """The preemption signal if any rank got one, so that all ranks stop at the same step."""
    flag = torch.tensor([job.preempt_requested() or 0], device=world.device)
    if world.size > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


def log(world: World, text: str) -> None:
    if world.is_main:
        print(text, flush=True)


def train(args: argparse.Namespace, world: World) -> int:
    """The loop; returns the exit status (128 + signal after a preemption)."""
    model = build_model(args).to(world.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    path = checkpoint_path(args)
    start_step = load_checkpoint(path, model, optimizer)
    log(
        world,
        f"backend={dist.get_backend() if world.size > 1 else 'none'} world_size={world.size} "
        f"master_port={os.environ.get('MASTER_PORT', '-')} device={world.device}",
    )
    log(world, f"resumed from step {start_step}" if start_step else "starting from step 0")
    device_ids = [world.device.index] if world.device.type == "cuda" else None
    ddp = nn.parallel.DistributedDataParallel(model, device_ids) if world.size > 1 else model
    teacher, loss_fn = Teacher(args.features, args.seed), nn.MSELoss()
    samples_per_step = args.batch_size * world.size
    window_start_s, window_steps = time.perf_counter(), 0
    for step in range(start_step, args.steps):
        x, y = (t.to(world.device) for t in teacher.batch(step, world.rank, args.batch_size))
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        optimizer.step()
        done, window_steps = step + 1, window_steps + 1
        signum = agreed_stop_signal(world)
        if world.is_main:
            job.progress(done / args.steps, f"step {done}/{args.steps}")
            if signum or done % args.checkpoint_every == 0 or done == args.steps:
                save_checkpoint(path, model, optimizer, done)
                print(f"checkpoint saved at step {done}", flush=True)
        if done % args.log_every == 0 or done == args.steps or signum:
            elapsed_s = time.perf_counter() - window_start_s
            log(
                world,
                f"step {done} loss {loss.item():.4f} "
                f"{samples_per_step * window_steps / elapsed_s:.0f} samples/s",
            )
            window_start_s, window_steps = time.perf_counter(), 0
        if signum:
            log(world, f"preempted by signal {signum} at step {done}; checkpoint saved, exiting")
            return 128 + signum
    return 0


def evaluate(args: argparse.Namespace) -> int:
    """The checkpoint's loss on batches no rank trains on; 1 above --max-loss, 3 without one."""
    path = checkpoint_path(args)
    if not path.exists():
        print(f"no checkpoint at {path}; train first", file=sys.stderr)
        return 3
    model = build_model(args).eval()
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    teacher, loss_fn = Teacher(args.features, args.seed), nn.MSELoss()
    with torch.inference_mode():
        # Rank numbers far above any world size: batches that training never drew.
        losses = [
            loss_fn(model(x), y).item()
            for x, y in (teacher.batch(0, EVAL_RANK + i, 256) for i in range(8))
        ]
    loss = sum(losses) / len(losses)
    print(f"eval loss {loss:.4f} at step {state['step']}", flush=True)
    if args.max_loss is not None and loss > args.max_loss:
        print(f"eval loss {loss:.4f} is above --max-loss {args.max_loss}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.eval_only:
        return evaluate(args)
    # Poll at step boundaries rather than checkpoint inside the signal handler: the handler
    # could run in the middle of optimizer.step(), and DDP ranks must stop at the same step.
    job.on_preempt(exit_on_sigterm=False)
    world = setup_world(args.backend)
    try:
        status = train(args, world)
        if world.size > 1:
            dist.barrier()  # nobody tears the group down while a peer is still in a collective
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return status


def leave(status: int) -> None:
    """Exit with the run's status, after Python's own exit work (atexit: gpusched.job's last
    progress report) but without the C++ teardown that follows it. With the process group
    destroyed and the checkpoint written the run is over; yet torch's distributed threads
    can abort the interpreter's teardown on a busy machine ("terminate called without an
    active exception", SIGABRT), which torchrun reports as a failed run."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    leave(main())
