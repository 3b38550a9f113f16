"""The weight mapping between tformer's Transformer and Marian's: the permutation of the model
dimension, and a round trip."""

from __future__ import annotations

import torch

from tests.conftest import tiny_config
from tformer_cli.interop.hf import from_marian, stream_permutation, to_marian
from tformer_cli.model import Transformer
from tformer_cli.model.layers import sinusoidal_positions


def marian_sinusoid(n: int, d: int) -> torch.Tensor:
    """Marian's table as transformers builds it: sines in the first half, cosines after."""
    j = torch.arange(d, dtype=torch.float64)
    angle = torch.arange(n, dtype=torch.float64)[:, None] / 10000 ** (2 * (j // 2) / d)
    half = (d + 1) // 2
    return torch.cat([torch.sin(angle[:, 0::2]), torch.cos(angle[:, 1::2])], dim=1)[:, : half * 2]


def test_the_permutation_maps_our_interleaved_table_onto_marians_halves():
    for d in (8, 32, 512):
        ours = sinusoidal_positions(64, d)
        assert torch.allclose(ours[:, stream_permutation(d)].double(), marian_sinusoid(64, d),
                              atol=1e-5)  # fmt: skip


def test_to_marian_and_back_is_the_identity_with_the_vocabulary_in_place():
    cfg = tiny_config(output_bias=True, tie_embeddings=False)
    torch.manual_seed(0)
    state = Transformer(cfg).state_dict()
    back = from_marian(to_marian(state, cfg), cfg, torch.arange(cfg.vocab_size))
    assert back.keys() == {k for k in state if "sinusoid" not in k}
    assert all(torch.equal(back[k], state[k]) for k in back)
