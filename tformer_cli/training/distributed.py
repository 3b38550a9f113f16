"""Data parallelism on PyTorch's own engine: ``torchrun`` starts one process per device, each
trains a DistributedDataParallel copy of the model, and DDP all-reduces the gradients.

An update takes ``max(accum, N)`` consecutive batches of the epoch (the same on every rank), and
rank r takes batches r, r+N, r+2N, ...: with ``accum`` a multiple of N the global batch is one
process's with ``--accum``, whatever N is, and the learning rate needs no change.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tformer_cli.device import allowed_cpus
from tformer_cli.errors import TformerError


@dataclass(frozen=True)
class World:
    """This process's place among the ``size`` training processes (1: plain training)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0 alone logs, validates and writes the run folder."""
        return self.rank == 0

    def shard(self, group: list[list[int]]) -> list[list[int]]:
        """This rank's batches of one update: every ``size``-th batch from its rank on."""
        return group[self.rank :: self.size]


ONE_PROCESS = World()


def init_world(device_type: str) -> World:
    """Join the process group ``torchrun`` describes in the environment (NCCL on CUDA, gloo
    on CPU)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return ONE_PROCESS
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(minutes=30))
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def leave_world(world: World) -> None:
    """Leave the process group once every rank is done with it (else gloo's threads may
    abort a rank whose peer still has a collective in flight)."""
    if world.size > 1 and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def barrier(world: World) -> None:
    if world.size > 1:
        dist.barrier()


def agree(world: World, flags: list[bool], device: torch.device) -> list[bool]:
    """Each flag true on any rank is true on all (one tiny all-reduce)."""
    if world.size == 1:
        return flags
    t = torch.tensor(flags, dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(x) for x in t.tolist()]


def from_main(world: World, values: list[float], device: torch.device) -> list[float]:
    """Rank 0's ``values`` on every rank (one broadcast, float64: integers up to 2^53 exact)."""
    if world.size == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.broadcast(t, src=0)
    return t.tolist()


LAUNCH_OPTIONS = ("--nproc", "--nnodes", "--rdzv-endpoint")


def launch(nproc: int, args: list[str], nnodes: str = "1", rdzv_endpoint: str | None = None) -> int:
    """``tformer train --nproc N ...``: the same train command (``args``) under ``torchrun``
    (with ``--nnodes`` and ``--rdzv-endpoint`` for several machines); its exit code."""
    kept, skip = [], False
    for a in args:  # the launcher's options stay here (torchrun would also take --nproc)
        if not skip and a.split("=", 1)[0] not in LAUNCH_OPTIONS:
            kept.append(a)
        skip = a in LAUNCH_OPTIONS
    sizes = nnodes.split(":")  # N, or MIN:MAX for an elastic job
    if len(sizes) > 2 or not all(n.isdigit() and int(n) >= 1 for n in sizes):
        raise TformerError(f"--nnodes takes a number of machines N or MIN:MAX, not {nnodes!r}")
    if nnodes != "1" and rdzv_endpoint is None:
        raise TformerError("--nnodes above 1 needs --rdzv-endpoint HOST:PORT")
    # torchrun of this interpreter (a `torchrun` on PATH may belong to another Python)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--nnodes", nnodes]  # fmt: skip
    if rdzv_endpoint:
        command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint]
    else:
        command += ["--standalone"]
    command += ["-m", "tformer_cli", "train", *kept]
    # torchrun in a session of its own: a Ctrl-C or SIGTERM reaches this process alone, which
    # passes it on to the workers; they save, stop and exit 0 (LAUNCHED, see `tformer train`),
    # so torchrun ends quietly rather than printing its own signal's traceback.
    env = {**os.environ, LAUNCHED: "1"}
    # set here, torchrun prints no banner about it (each worker sets its own share of the cores)
    env.setdefault("OMP_NUM_THREADS", str(max(1, len(allowed_cpus()) // nproc)))
    try:
        torchrun = subprocess.Popen(command, env=env, start_new_session=True)
    except OSError as e:
        raise TformerError(f"cannot start torchrun: {e.strerror or e}") from None
    stopped: list[int] = []

    def forward(signum: int, frame: object) -> None:
        stopped.append(signum)
        for pid in children(torchrun.pid) or [-torchrun.pid]:  # else its whole group
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = torchrun.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 130 if stopped and code == 0 else code


LAUNCHED = "TFORMER_LAUNCHED"  # set for the workers of `tformer train --nproc`


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (Linux's /proc; none elsewhere): torchrun's workers."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            found += [int(child) for child in task.read_text().split()]
    return found
