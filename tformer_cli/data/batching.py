"""Token-budget batches of similar-length sentences, padded into tensors."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from tformer_cli.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


def pad(seqs: Sequence[Sequence[int]], pad_id: int = PAD_ID) -> Tensor:
    """Right-pad token lists into a (B, T_max) long tensor."""
    out = torch.full((len(seqs), max(map(len, seqs), default=0)), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out


@dataclass
class Batch:
    """A teacher-forcing batch: src (B, S); decoder input ``<s> y`` and output ``y </s>`` (B, T);
    ``real`` (N,): the flat indices of the real (non-pad) target positions, found on the host."""

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    real: Tensor

    @property
    def n_tgt_tokens(self) -> int:
        return self.real.numel()

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"
        return Batch(*(t.to(device, non_blocking=nb) for t in dataclasses.astuple(self)))


def make_batch(src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]) -> Batch:
    """Add ``</s>`` to sources, ``<s>``/``</s>`` to targets, and pad."""
    tgt_out = pad([[*t, EOS_ID] for t in tgt])  # (B, T)
    return Batch(
        src=pad([[*s, EOS_ID] for s in src]),
        tgt_in=pad([[BOS_ID, *t] for t in tgt]),
        tgt_out=tgt_out,
        real=(tgt_out != PAD_ID).flatten().nonzero().squeeze(1),  # (N,)
    )


def token_batches(
    lengths: Sequence[int] | np.ndarray,
    max_tokens: int,
    rng: random.Random | None = None,
    pool: int = 100,
    max_sentences: int | None = None,
) -> list[list[int]]:
    """``plan_batches`` as lists of indices (for the small splits of evaluation)."""
    return [b.tolist() for b in plan_batches(lengths, max_tokens, rng, pool, max_sentences)]


def plan_batches(
    lengths: Sequence[int] | np.ndarray,
    max_tokens: int,
    rng: random.Random | None = None,
    pool: int = 100,
    max_sentences: int | None = None,
) -> list[np.ndarray]:
    """Group example indices into batches of at most ``max_tokens`` padded tokens (and
    ``max_sentences`` rows); ``lengths[i]``: example i's padded cost per row. With ``rng``,
    shuffled, sorted by length within pools of ``pool`` batches' worth, and the batches
    shuffled; without it, by length. An example over the budget gets a batch of its own."""
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.arange(len(lengths), dtype=np.int64)
    if rng is not None and len(order):
        rng.shuffle(order)  # type: ignore[arg-type]  # swaps in place, as on a list
        mean = max(1.0, int(lengths.sum()) / len(lengths))
        size = max(1, int(pool * max_tokens / mean))
    else:
        size = max(1, len(order))
    batches: list[np.ndarray] = []
    for start in range(0, len(order), size):
        chunk = order[start : start + size]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches += _greedy(chunk, lengths[chunk], max_tokens, max_sentences)
    if rng is not None:
        rng.shuffle(batches)
    return batches


def _greedy(
    chunk: np.ndarray, sorted_lengths: np.ndarray, max_tokens: int, max_sentences: int | None
) -> list[np.ndarray]:
    """Cut ``chunk`` (sorted by length) into batches, each as long as it can be: row k joins
    the batch that starts at p while (k - p + 1) * length_k <= max_tokens."""
    batches, p, n = [], 0, len(chunk)
    cap = n if max_sentences is None else max_sentences
    while p < n:
        width = min(n - p, cap, max(1, max_tokens) + 1)  # no batch holds more rows than tokens
        cost = np.arange(1, width + 1) * sorted_lengths[p : p + width]  # (width,)
        over = np.flatnonzero(cost[1:] > max_tokens)  # the first row always joins
        end = p + (int(over[0]) + 1 if len(over) else width)
        batches.append(chunk[p:end])
        p = end
    return batches


def padding_waste(
    batches: Sequence[Sequence[int] | np.ndarray], lengths: Sequence[int] | np.ndarray
) -> float:
    """Share of padded positions that hold padding, over all batches."""
    cost = np.asarray(lengths, dtype=np.int64)
    padded = sum(int(cost[np.asarray(b, dtype=np.int64)].max()) * len(b) for b in batches if len(b))
    return 1.0 - int(cost.sum()) / padded if padded else 0.0
