"""Run under ``torchrun`` by tests/training/test_distributed.py, in every process:

1. the gradient check: one ``train_step`` of a tiny model under DDP, each rank on its share of
   four micro-batches with plain SGD (lr 1, so the weight change is the gradient), against the
   same step in one process on all four (every rank computes that reference itself);
2. resume a run folder to MAX_STEPS with a Trainer, then check that every other rank holds the
   weights that rank 0 saved in last.pt;
3. list the data cache's Arrow files each rank has memory-mapped (``/proc/self/maps``).

Rank 0 writes what it saw as JSON. Usage:
torchrun --standalone --nproc-per-node N tests/training/ddp_worker.py RUN_DIR MAX_STEPS OUT_JSON
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from rich.console import Console
from torch.nn.parallel import DistributedDataParallel

from tformer_cli.checkpoint import RunConfig, load_state
from tformer_cli.config import ModelConfig, TrainConfig
from tformer_cli.data.batching import make_batch
from tformer_cli.model import Transformer
from tformer_cli.training.distributed import ONE_PROCESS, World
from tformer_cli.training.trainer import Trainer, train_step


def gradient_gap(world: World) -> float:
    """Largest |DDP weight change - one-process weight change| of one SGD step."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=30, d_model=16, h=2, d_ff=32, dropout=0.0))
    alone = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    batches = [
        make_batch(
            [torch.randint(4, 30, (n,), generator=g).tolist() for n in (3, 5)],
            [torch.randint(4, 30, (n + 1,), generator=g).tolist() for n in (2, 4)],
        )
        for _ in range(4)
    ]
    n_tokens = sum(b.n_tgt_tokens for b in batches)
    cfg, cpu = TrainConfig(clip_norm=0.0), torch.device("cpu")

    def sgd(m: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(m.parameters(), lr=1.0)

    inputs = [b.tgt_in for b in batches]
    train_step(alone, sgd(alone), batches, inputs, 1 / n_tokens, cfg, cpu, None, None, ONE_PROCESS)
    mine = world.shard(batches)
    ddp = DistributedDataParallel(model)
    train_step(ddp, sgd(model), mine, [b.tgt_in for b in mine], world.size / n_tokens, cfg, cpu,
               None, None, world)  # fmt: skip
    return max(
        (a - b).abs().max().item()
        for a, b in zip(alone.parameters(), model.parameters(), strict=True)
    )


def mapped_arrow_files() -> list[str]:
    """The Arrow files this process maps, as ``device inode path`` (``/proc/self/maps``)."""
    found = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].endswith(".arrow"):
            found.add(f"{fields[3]} {fields[4]} {fields[5]}")
    return sorted(found)


def main() -> None:
    run_dir, max_steps, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    saved = RunConfig.load(run_dir)
    cfg = dataclasses.replace(saved.train, max_steps=max_steps)
    trainer = Trainer(run_dir, saved.model, cfg, resume=True, console=Console(file=io.StringIO()))
    gap = gradient_gap(trainer.world)
    result = trainer.run(quiet=True)
    dist.barrier()  # rank 0 has written last.pt (and then loaded model.pt for the test BLEU)
    last = load_state(run_dir / "last.pt")["model"]
    mine = trainer.model.state_dict()
    same = torch.tensor([trainer.world.main or all(torch.equal(mine[k], last[k]) for k in last)])
    everyone = [torch.zeros_like(same) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, same)
    maps: list[list[str]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(maps, mapped_arrow_files())
    if trainer.world.main:
        report = {"world": trainer.world.size, "step": result.state.step,
                  "same_weights": all(bool(x) for x in everyone), "gradient_gap": gap,
                  "mapped": maps}  # fmt: skip
        out.write_text(json.dumps(report), encoding="utf-8")
    trainer.close()


if __name__ == "__main__":
    main()
