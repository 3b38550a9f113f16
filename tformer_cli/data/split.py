"""An encoded split of parallel data, as training validates on it and `tformer eval` scores it,
and the one rule for which pairs a model can read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Split:
    """Token ids without specials, and the raw target text (the references for BLEU)."""

    src: list[list[int]]
    tgt: list[list[int]]
    refs: list[str]

    def select(self, keep: Sequence[int]) -> Split:
        """The pairs at indices ``keep``, in that order."""
        return Split(
            [self.src[i] for i in keep], [self.tgt[i] for i in keep], [self.refs[i] for i in keep]
        )


def fits_positions(
    src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]], max_positions: int
) -> list[int]:
    """Indices of the pairs a model of ``max_positions`` positions reads whole: each side at
    most ``max_positions - 1`` tokens, leaving room for ``</s>`` (source) or ``<s>`` (target)."""
    longest = max_positions - 1
    return [
        i for i, (s, t) in enumerate(zip(src, tgt, strict=True)) if max(len(s), len(t)) <= longest
    ]
