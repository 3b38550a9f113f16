"""Translation quality: sacrebleu BLEU/chrF; teacher-forced cross-entropy, perplexity, accuracy."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import sacrebleu
import torch
import torch.nn.functional as F

from tformer_cli.batching import make_batch, token_batches
from tformer_cli.model import Transformer
from tformer_cli.tokenizer import PAD_ID


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU (sacrebleu defaults: 13a tokenization, cased) of detokenized text."""
    return sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score


@dataclass(frozen=True)
class TeacherForced:
    """Mean NLL of each gold token given the gold prefix, and the argmax accuracy."""

    xent: float
    accuracy: float
    tokens: int

    @property
    def ppl(self) -> float:
        return math.exp(min(self.xent, 100.0))


@torch.inference_mode()
def teacher_forced(
    model: Transformer,
    src: Sequence[Sequence[int]],
    tgt: Sequence[Sequence[int]],
    max_tokens: int = 4096,
    dtype: torch.dtype | None = None,
) -> TeacherForced:
    """tf_xent, tf_ppl and tf_acc over every target token, ``</s>`` included."""
    device = next(model.parameters()).device
    lengths = [max(len(s), len(t)) + 1 for s, t in zip(src, tgt, strict=True)]
    nll, correct, n = 0.0, 0, 0
    for idx in token_batches(lengths, max_tokens):
        b = make_batch([src[i] for i in idx], [tgt[i] for i in idx]).to(device)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = model(b.src, b.tgt_in)  # (B, T, V)
        logits = logits.float().flatten(0, 1)  # (B*T, V)
        gold = b.tgt_out.flatten()  # (B*T,)
        real = gold != PAD_ID
        nll += float(F.cross_entropy(logits, gold, ignore_index=PAD_ID, reduction="sum"))
        correct += int((logits.argmax(-1) == gold)[real].sum())
        n += int(real.sum())
    return TeacherForced(nll / max(n, 1), correct / max(n, 1), n)
