"""Search for translations: batched greedy decoding with the KV cache."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from tformer_cli.batching import pad, token_batches
from tformer_cli.checkpoint import LoadedRun
from tformer_cli.config import DecodeConfig
from tformer_cli.device import inference
from tformer_cli.model import Transformer
from tformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID, decode, encode

DEFAULT = DecodeConfig()


@dataclass(frozen=True)
class Hypothesis:
    """A translation: token ids (no ``<s>``/``</s>``) and their summed log-probability."""

    tokens: list[int]
    score: float
    finished: bool = True


def max_lengths(src: Tensor, cfg: DecodeConfig, max_positions: int) -> Tensor:
    """Per-sentence limit on generated tokens, ``</s>`` included: ``a * |src| + b``. Shape (B,)."""
    src_len = (src != PAD_ID).sum(dim=1)
    return (cfg.max_len_a * src_len + cfg.max_len_b).long().clamp(1, max_positions - 1)


@torch.inference_mode()
def greedy_search(
    model: Transformer, src: Tensor, cfg: DecodeConfig = DEFAULT, use_cache: bool = True
) -> list[Hypothesis]:
    """Pick the most probable next token until ``</s>`` or the length limit, for a batch src (B, S).

    With the cache each step feeds only the newest token; without it the whole prefix is
    decoded again (for comparison and teaching). Finished sentences leave the active batch.
    """
    B = src.size(0)
    limits = max_lengths(src, cfg, model.cfg.max_positions)  # (B,)
    T_max = int(limits.max())
    memory, src_mask = model.encode(src)  # (B, S, d), (B, 1, 1, S)
    cache = model.init_cache(memory, src_mask, T_max) if use_cache else None
    y = torch.full((B, T_max + 1), PAD_ID, dtype=torch.long, device=src.device)  # <s> y_1 .. y_T
    y[:, 0] = BOS_ID
    scores = torch.zeros(B, device=src.device)
    alive = torch.arange(B, device=src.device)  # original row of each active row
    out: list[Hypothesis | None] = [None] * B
    for t in range(T_max):
        inp = y[:, t : t + 1] if cache is not None else y[:, : t + 1]
        logits = model.decode(inp, memory, src_mask, cache)[:, -1].float()  # (b, V)
        logp = logits.log_softmax(dim=-1)
        best = logp.argmax(dim=-1)  # (b,)
        scores[alive] += logp.gather(1, best[:, None]).squeeze(1)
        y[:, t + 1] = best
        done = (best == EOS_ID) | (limits[alive] <= t + 1)
        if not done.any():
            continue
        for r in done.nonzero().flatten().tolist():
            row = int(alive[r])
            ended = bool(best[r] == EOS_ID)
            out[row] = Hypothesis(y[r, 1 : t + 1 + (not ended)].tolist(), float(scores[row]), ended)
        keep = (~done).nonzero().flatten()
        if keep.numel() == 0:
            break
        alive, y = alive[keep], y[keep]
        if cache is not None:
            cache.select(keep, keep)
        else:
            memory, src_mask = memory[keep], src_mask[keep]
    return [h for h in out if h is not None]


def translate_ids(
    model: Transformer,
    sources: Sequence[Sequence[int]],
    cfg: DecodeConfig = DEFAULT,
    max_tokens: int = 4096,
    use_cache: bool = True,
) -> list[Hypothesis]:
    """Translate token lists (no ``</s>``) in length-sorted batches; results in input order."""
    device = next(model.parameters()).device
    lengths = [len(s) + 1 for s in sources]
    results: list[Hypothesis | None] = [None] * len(sources)
    for batch in token_batches(lengths, max_tokens):
        src = pad([[*sources[i], EOS_ID] for i in batch]).to(device)
        for i, hyp in zip(batch, greedy_search(model, src, cfg, use_cache), strict=True):
            results[i] = hyp
    return [h for h in results if h is not None]


def translate_texts(
    run: LoadedRun,
    texts: Sequence[str],
    cfg: DecodeConfig = DEFAULT,
    max_tokens: int = 4096,
    use_cache: bool = True,
) -> list[str]:
    """Tokenize, translate and detokenize sentences with a loaded run."""
    with inference(run.device, run.dtype):
        hyps = translate_ids(run.model, encode(run.tokenizer, texts), cfg, max_tokens, use_cache)
    return decode(run.tokenizer, [h.tokens for h in hyps])
