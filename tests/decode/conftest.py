"""Shared by the decoding tests: a tiny model trained to reverse word sequences."""

from __future__ import annotations

import pytest
import torch

from tformer_cli.config import ModelConfig
from tformer_cli.data.batching import make_batch
from tformer_cli.data.tokenizer import PAD_ID
from tformer_cli.model import Transformer


def random_sources(n: int, seed: int, vocab: int = 16) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 7, (n,), generator=g).tolist()
    return [torch.randint(4, vocab, (k,), generator=g).tolist() for k in lengths]


@pytest.fixture(scope="module")
def trained_model() -> Transformer:
    """A tiny model trained briefly to reverse word sequences: it emits ``</s>`` at varied
    steps (an untrained model almost never does), so finished rows leave the batch mid-search."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=16, d_model=32, h=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2,
        dropout=0.0, max_positions=64,
    )  # fmt: skip
    model = Transformer(cfg)
    src = random_sources(32, seed=1)
    b = make_batch(src, [s[::-1] for s in src])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(60):
        logits = model(b.src, b.tgt_in)
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), b.tgt_out.flatten(), ignore_index=PAD_ID
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="session")
def step_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One ``XDG_CACHE_HOME`` for the compiled CPU steps of the whole session: the trained model
    is the same in every module (seeded), so its step is built once and then loaded."""
    return str(tmp_path_factory.mktemp("xdg"))
