"""Token-budget batches of similar-length sentences, padded into tensors."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass

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
    ``real`` (N,): the flat indices of the N real (non-pad) target positions, found on the host
    when the batch is made, so the device never has to report how many there are."""

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
    lengths: Sequence[int],
    max_tokens: int,
    rng: random.Random | None = None,
    pool: int = 100,
    max_sentences: int | None = None,
) -> list[list[int]]:
    """Group example indices into batches of at most ``max_tokens`` padded tokens.

    ``lengths[i]`` is the padded cost of example i per row (e.g. ``max(|src|, |tgt|) + 1``).
    With ``rng``, examples are shuffled, sorted by length within pools of ``pool`` batches'
    worth (so batches differ from epoch to epoch while padding stays small) and the batches are
    shuffled; without it, order is by length (deterministic, for evaluation).
    ``max_sentences`` also caps the rows per batch. A single example longer than the budget
    still gets a batch of its own.
    """
    order = list(range(len(lengths)))
    if rng is not None:
        rng.shuffle(order)
        mean = max(1.0, sum(lengths) / max(1, len(lengths)))
        size = max(1, int(pool * max_tokens / mean))
        chunks = [order[i : i + size] for i in range(0, len(order), size)]
    else:
        chunks = [order]
    batches: list[list[int]] = []
    for chunk in chunks:
        chunk.sort(key=lambda i: lengths[i])
        batch: list[int] = []
        longest = 0
        for i in chunk:
            longest_if_added = max(longest, lengths[i])
            full = max_sentences is not None and len(batch) >= max_sentences
            if batch and (full or longest_if_added * (len(batch) + 1) > max_tokens):
                batches.append(batch)
                batch, longest_if_added = [], lengths[i]
            batch.append(i)
            longest = longest_if_added
        if batch:
            batches.append(batch)
    if rng is not None:
        rng.shuffle(batches)
    return batches


def padding_waste(batches: Sequence[Sequence[int]], lengths: Sequence[int]) -> float:
    """Share of padded positions that hold padding, over all batches."""
    padded = sum(max(lengths[i] for i in b) * len(b) for b in batches)
    return 1.0 - sum(lengths) / padded if padded else 0.0
