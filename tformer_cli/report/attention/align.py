"""Gold word alignments vs cross-attention: which head learned to align (and to reorder)?

The toy corpus ships Pharaoh alignments (``{split}.align``: ``i-j`` links, 0-based source word i
and target word j). A head "aligns" a target word when the source word it gives the most
attention to, at the step generating that word, is one the word is linked to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import Tensor

from tformer_cli.data.tokenizer import EOS_ID
from tformer_cli.errors import TformerError
from tformer_cli.model import Transformer
from tformer_cli.report.attention.maps import collect


@dataclass(frozen=True)
class AlignmentScore:
    """Per (layer, head), the share of gold-linked target words whose most attended source word
    (the weights of the row generating the word's first subword, summed per source word) is
    linked to it; ``crossing``: the same on words with a crossing (reordered) link."""

    accuracy: Tensor  # (L, h)
    crossing: Tensor  # (L, h)
    words: int
    crossing_words: int
    sentences: int
    skipped: int  # pairs whose subwords could not be mapped to the gold words

    def best(self) -> tuple[int, int]:
        """0-based (layer, head) with the highest accuracy."""
        flat = int(self.accuracy.flatten().argmax())
        return divmod(flat, self.accuracy.size(1))


def word_index(tokens: Sequence[str], n_words: int) -> list[int] | None:
    """Word number of each subword (a word starts at each ``▁``-initial piece); ``None`` when
    the count disagrees with ``n_words`` (another pre-tokenizer)."""
    words, current = [], -1
    for t in tokens:
        current += t.startswith("▁")
        words.append(max(current, 0))
    return words if current + 1 == n_words else None


def crossing_words(links: Sequence[tuple[int, int]]) -> set[int]:
    """Target words j with a link (i, j) that crosses another link (i', j'): (i-i')(j-j') < 0."""
    return {j for i, j in links for i2, j2 in links if (i - i2) * (j - j2) < 0}


def _inside(
    links: Sequence[tuple[int, int]], src_words: list[int] | None, tgt_words: list[int] | None
) -> bool:
    """Both sides mapped to words, and some links, all within them (else: another tokenizer, or
    a bad alignment file)."""
    if src_words is None or tgt_words is None:
        return False
    return bool(links) and all(i <= src_words[-1] and j <= tgt_words[-1] for i, j in links)


def alignment_accuracy(
    model: Transformer,
    tok: Tokenizer,
    pairs: Sequence[tuple[str, str]],
    alignments: Sequence[Sequence[tuple[int, int]]],
    batch_size: int = 32,
) -> AlignmentScore:
    """Score every cross-attention head against gold links, teacher-forced on the reference."""
    L, h = len(model.decoder), model.cfg.h
    correct, cross_correct = torch.zeros(L, h), torch.zeros(L, h)
    words = n_crossing = used = skipped = 0
    for start in range(0, len(pairs), batch_size):
        chunk = list(range(start, min(start + batch_size, len(pairs))))
        encs = [
            [tok.encode(pairs[k][side], add_special_tokens=False) for side in (0, 1)] for k in chunk
        ]
        weights = collect(model, [s.ids for s, _ in encs], [[*t.ids, EOS_ID] for _, t in encs])
        for b, k in enumerate(chunk):
            (src, tgt), links = encs[b], alignments[k]
            src_words = word_index(src.tokens, len(pairs[k][0].split()))
            tgt_words = word_index(tgt.tokens, len(pairs[k][1].split()))
            if not _inside(links, src_words, tgt_words):
                skipped += 1
                continue
            used += 1
            n_src = src_words[-1] + 1
            to_word = torch.zeros(len(src_words) + 1, n_src)  # (S, n_src), "</s>" row stays 0
            to_word[torch.arange(len(src_words)), torch.tensor(src_words)] = 1.0
            first_row = {}  # target word -> the row generating its first subword
            for row, j in enumerate(tgt_words):
                first_row.setdefault(j, row)
            gold = torch.zeros(tgt_words[-1] + 1, n_src, dtype=torch.bool)
            for i, j in links:
                gold[j, i] = True
            linked = [j for j in sorted(first_row) if gold[j].any()]
            rows = torch.tensor([first_row[j] for j in linked])
            w = weights["cross"][b, :, :, rows, : len(src_words) + 1]  # (L, h, n, S)
            strongest = (w @ to_word).argmax(dim=-1)  # (L, h, n) source word per target word
            hit = gold[torch.tensor(linked)[None, None, :], strongest].float()  # (L, h, n)
            reordered = crossing_words(links)
            crossing = torch.tensor([j in reordered for j in linked], dtype=torch.bool)
            correct += hit.sum(dim=-1)
            cross_correct += hit[..., crossing].sum(dim=-1)
            words += len(linked)
            n_crossing += int(crossing.sum())
    accuracy, on_crossing = correct / max(words, 1), cross_correct / max(n_crossing, 1)
    return AlignmentScore(accuracy, on_crossing, words, n_crossing, used, skipped)


def read_aligned_corpus(
    folder: Path, split: str = "test", limit: int | None = None
) -> tuple[list[tuple[str, str]], list[list[tuple[int, int]]]]:
    """``{split}.tsv`` pairs and ``{split}.align`` links of a folder (the toy corpus layout)."""
    from tformer_cli.data.toy import read_alignments

    tsv, align = folder / f"{split}.tsv", folder / f"{split}.align"
    if not (tsv.is_file() and align.is_file()):
        raise TformerError(f"{folder}: needs {split}.tsv and {split}.align for alignment accuracy")
    lines = tsv.read_text(encoding="utf-8").splitlines()[:limit]
    pairs = [(s, t) for s, t in (line.split("\t", 1) for line in lines)]
    return pairs, read_alignments(align)[: len(pairs)]
