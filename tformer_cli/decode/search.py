"""Search for translations with the KV cache: batched greedy decoding and beam search; and the
translation of text streams, chunk by chunk, for ``tformer translate``."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch
from torch import Tensor

from tformer_cli.checkpoint import LoadedRun
from tformer_cli.config import DecodeConfig
from tformer_cli.data.batching import pad, token_batches
from tformer_cli.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, decode, encode
from tformer_cli.device import inference
from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_write
from tformer_cli.model import DecoderCache, Transformer

DEFAULT = DecodeConfig()


@dataclass(frozen=True)
class Hypothesis:
    """A translation: token ids (no ``<s>``/``</s>``), their summed log-probability ``logprob``
    (``</s>`` included when ``finished``), and the search's ``score`` (beam: length-normalised)."""

    tokens: list[int]
    logprob: float
    score: float
    finished: bool = True


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016), |Y| with ``</s>``."""
    return ((5 + length) / 6) ** alpha


def max_lengths(src: Tensor, cfg: DecodeConfig, max_positions: int) -> Tensor:
    """Per-sentence limit on generated tokens, ``</s>`` included: ``a * |src| + b``. Shape (B,)."""
    src_len = (src != PAD_ID).sum(dim=1)
    return (cfg.max_len_a * src_len + cfg.max_len_b).long().clamp(1, max_positions - 1)


def next_logprobs(
    model: Transformer,
    y: Tensor,
    memory: Tensor,
    src_mask: Tensor,
    cache: DecoderCache | None,
    allow_eos: bool = True,
) -> Tensor:
    """log p(. | x, y) for the last position: (b, V), fp32. With a cache, y holds the newest
    tokens only. ``<pad>`` and ``<s>`` are never generated (nor ``</s>`` unless ``allow_eos``),
    but the other log-probabilities stay the model's own (no renormalisation), so scores equal
    a teacher-forced pass's."""
    if cache is None:  # y is the whole prefix: the output layer scores its last position only
        last = torch.zeros_like(y, dtype=torch.bool)
        last[:, -1] = True
        logits = model.decode(y, memory, src_mask, None, at=last)  # (b, V)
    else:
        logits = model.decode(y, memory, src_mask, cache)[:, -1]  # (b, V)
    logp = logits.float().log_softmax(dim=-1)  # (b, V)
    for never in (PAD_ID, BOS_ID) if allow_eos else (PAD_ID, BOS_ID, EOS_ID):
        logp.select(1, never).fill_(float("-inf"))  # a scalar fill: no host-to-device copy
    return logp


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
    logprob = torch.zeros(B, device=src.device)  # of each active row, as are y and limits
    alive = torch.arange(B, device=src.device)  # original row of each active row
    out: list[Hypothesis] = [None] * B  # type: ignore[list-item]
    for t in range(T_max):
        inp = y[:, t : t + 1] if cache is not None else y[:, : t + 1]
        logp = next_logprobs(model, inp, memory, src_mask, cache, t >= cfg.min_len)  # (b, V)
        best_logp, best = logp.max(dim=-1)  # (b,), (b,): value and index in one pass
        logprob += best_logp
        y[:, t + 1] = best
        done = (best == EOS_ID) | (limits <= t + 1)
        if not done.any():
            continue
        for r in done.nonzero().flatten().tolist():
            ended, lp = bool(best[r] == EOS_ID), float(logprob[r])
            out[int(alive[r])] = Hypothesis(y[r, 1 : t + 1 + (not ended)].tolist(), lp, lp, ended)
        keep = (~done).nonzero().flatten()
        if keep.numel() == 0:
            break
        alive, y, logprob, limits = alive[keep], y[keep], logprob[keep], limits[keep]
        if cache is not None:
            cache.select(keep, keep)
        else:
            memory, src_mask = memory[keep], src_mask[keep]
    return out


@torch.inference_mode()
def beam_search(
    model: Transformer, src: Tensor, cfg: DecodeConfig = DEFAULT, use_cache: bool = True
) -> list[list[Hypothesis]]:
    """The ``cfg.nbest`` best hypotheses per sentence of src (B, S), best first, by
    ``logprob / lp(|Y|)``.

    Beams are flattened to (B*k) rows, sentence-major. Each step: add every continuation's
    log-probability to its beam's score, take the top 2k of the sentence's k*V candidates;
    those in the top k that end in ``</s>`` are finished, the best k others live on (the cache
    rows reordered to follow them). A sentence is done when it has k finished hypotheses and no
    live beam can still beat the worst of them: scores only fall as tokens are added, so a live
    beam's best reachable normalised score is its score over lp at the length that maximises it.
    Done sentences leave the batch; cross-attention K, V stay one copy per sentence.
    """
    k, B, device = cfg.beam, src.size(0), src.device
    limits = max_lengths(src, cfg, model.cfg.max_positions)  # (B,)
    T_max = int(limits.max())
    memory, src_mask = model.encode(src)  # (B, S, d), (B, 1, 1, S)
    if use_cache:
        cache = model.init_cache(memory, src_mask, T_max, beams=k)
    else:
        cache = None
        memory, src_mask = memory.repeat_interleave(k, 0), src_mask.repeat_interleave(k, 0)
    y = torch.full((B * k, T_max + 1), PAD_ID, dtype=torch.long, device=device)
    y[:, 0] = BOS_ID
    scores = torch.full((B, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start equal: expand only the first at step 0
    sent = torch.arange(B, device=device)  # original index of each active sentence
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    rank = torch.arange(2 * k, device=device)
    for t in range(T_max):
        b = sent.numel()
        inp = y[:, t : t + 1] if cache is not None else y[:, : t + 1]
        logp = next_logprobs(model, inp, memory, src_mask, cache, t >= cfg.min_len)  # (b*k, V)
        V = logp.size(-1)
        cand = logp.add_(scores.view(-1, 1)).view(b, k * V)  # (b, k*V), in place
        top, idx = cand.topk(min(2 * k, k * V), dim=1)  # (b, 2k), best first
        beam, token = idx // V, idx % V  # (b, 2k)
        at_limit = limits[sent] <= t + 1  # (b,)
        ends = ((token == EOS_ID) | at_limit[:, None]) & (rank[: top.size(1)] < k) & top.isfinite()
        for i, j in ends.nonzero().tolist():
            eos = bool(token[i, j] == EOS_ID)
            prefix = y[int(i * k + beam[i, j]), 1 : t + 1].tolist()
            toks = prefix if eos else [*prefix, int(token[i, j])]
            lp = float(top[i, j])
            finished[int(sent[i])].append(
                Hypothesis(toks, lp, lp / length_penalty(t + 1, cfg.alpha), eos)
            )
        live_scores, pos = top.masked_fill(token == EOS_ID, float("-inf")).topk(k, dim=1)  # (b, k)
        rows = (
            torch.arange(b, device=device)[:, None] * k + beam.gather(1, pos)
        ).flatten()  # (b*k,)
        y = y[rows]
        y[:, t + 1] = token.gather(1, pos).flatten()
        scores = live_scores
        done = at_limit.clone()
        for i in (~at_limit).nonzero().flatten().tolist():
            hyps = finished[int(sent[i])]
            if len(hyps) >= k:
                worst = sorted(h.score for h in hyps)[-k]
                reach = max(
                    length_penalty(t + 2, cfg.alpha),
                    length_penalty(int(limits[sent[i]]), cfg.alpha),
                )
                best_reachable = float(scores[i, 0]) / reach  # scores are <= 0
                done[i] = best_reachable <= worst
        if done.any():
            keep = (~done).nonzero().flatten()  # (b',)
            if keep.numel() == 0:
                break
            keep_rows = (keep[:, None] * k + torch.arange(k, device=device)).flatten()  # (b'*k,)
            sent, scores, y, rows = (
                sent[keep],
                scores[keep],
                y[keep_rows],
                rows.view(b, k)[keep].flatten(),
            )
            if cache is None:
                memory, src_mask = memory[keep_rows], src_mask[keep_rows]
            else:
                cache.select(rows, keep)
        elif cache is not None:
            cache.select(rows)
    return [sorted(h, key=lambda h: -h.score)[: cfg.nbest] for h in finished]


def search(
    model: Transformer, src: Tensor, cfg: DecodeConfig = DEFAULT, use_cache: bool = True
) -> list[list[Hypothesis]]:
    """Greedy for ``beam == 1``, else beam search: the n-best list of each sentence of src."""
    if cfg.beam == 1:
        return [[h] for h in greedy_search(model, src, cfg, use_cache)]
    return beam_search(model, src, cfg, use_cache)


@dataclass(frozen=True)
class Translation:
    """The n-best hypotheses of one input, and the decoding time of its batch per sentence."""

    hypotheses: list[Hypothesis]
    seconds: float


def translate_ids(
    model: Transformer,
    sources: Sequence[Sequence[int]],
    cfg: DecodeConfig = DEFAULT,
    max_tokens: int = 4096,
    use_cache: bool = True,
    max_sentences: int | None = None,
    on_batch: Callable[[int], None] | None = None,
    first: int = 1,
) -> list[Translation]:
    """Translate token lists (no ``</s>``) in length-sorted batches; results in input order.
    An empty input (a blank line) gets one empty translation without running the model.
    A source longer than the model's positions (``</s>`` included) is an error naming it by
    its number, counted from ``first``: nothing is cut off silently.

    ``on_batch(n)`` is called after each batch of n sentences (for progress bars).
    """
    device = next(model.parameters()).device
    lengths = [len(s) + 1 for s in sources]
    limit = model.cfg.max_positions
    too_long = next((i for i, n in enumerate(lengths) if n > limit), None)
    if too_long is not None:
        raise TformerError(
            f"input {first + too_long} has {lengths[too_long]} tokens;"
            f" this model reads at most {limit}"
        )
    empty = Translation([Hypothesis([], 0.0, 0.0)], 0.0)
    results = [None if s else empty for s in sources]
    real = [i for i, s in enumerate(sources) if s]
    if on_batch is not None and len(real) < len(sources):
        on_batch(len(sources) - len(real))
    for sub in token_batches([lengths[i] for i in real], max_tokens, max_sentences=max_sentences):
        batch = [real[j] for j in sub]
        start = time.perf_counter()
        src = pad([[*sources[i], EOS_ID] for i in batch]).to(device)
        nbest = search(model, src, cfg, use_cache)
        seconds = (time.perf_counter() - start) / len(batch)
        for i, hyps in zip(batch, nbest, strict=True):
            results[i] = Translation(hyps, seconds)
        if on_batch is not None:
            on_batch(len(batch))
    return results  # type: ignore[return-value]


@dataclass(frozen=True)
class TextTranslation:
    """One input's n-best translations (detokenized) with their hypotheses, and timing."""

    source: str
    translations: list[str]
    hypotheses: list[Hypothesis]
    seconds: float


def translate_texts(
    run: LoadedRun,
    texts: Sequence[str],
    cfg: DecodeConfig = DEFAULT,
    max_tokens: int = 4096,
    use_cache: bool = True,
    max_sentences: int | None = None,
    on_batch: Callable[[int], None] | None = None,
    first: int = 1,
) -> list[TextTranslation]:
    """Tokenize, translate and detokenize sentences with a loaded run, in input order
    (``first``: the number of the first text, for error messages)."""
    with inference(run.device, run.dtype):
        sources = encode(run.tokenizer, texts)
        results = translate_ids(
            run.model, sources, cfg, max_tokens, use_cache, max_sentences, on_batch, first
        )
    return [
        TextTranslation(
            text, decode(run.tokenizer, [h.tokens for h in r.hypotheses]), r.hypotheses, r.seconds
        )
        for text, r in zip(texts, results, strict=True)
    ]


# ---------------------------------------------------------------------------- text streams
_BOM = b"\xef\xbb\xbf"


def read_lines(stream: BinaryIO, name: str) -> Iterator[str]:
    r"""The lines of a UTF-8 byte stream, each as soon as it arrives. A line is what ends in
    ``\n`` (or the stream): other Unicode separators (``\u2028``, ``\x85``, ``\x0c``...) stay
    inside it, as corpus files are read; a trailing ``\r`` (CRLF) and a leading byte order mark
    are dropped (a mark alone is no line). Invalid UTF-8 is an error naming ``name`` and the
    1-based line."""
    for number, raw in enumerate(stream, start=1):
        if number == 1 and not (raw := raw.removeprefix(_BOM)):
            return
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TformerError(
                f"{name} line {number} is not valid UTF-8 ({e.reason} at byte {e.start + 1})"
            ) from None
        yield line.removesuffix("\n").removesuffix("\r")


def check_arguments(texts: list[str]) -> list[str]:
    """``texts`` from the command line, if each is valid text: Python keeps an argument's
    bytes that are not valid UTF-8 as lone surrogates, which no tokenizer can take."""
    for number, text in enumerate(texts, start=1):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise TformerError(
                f"argument {number} is not valid UTF-8 (bad byte at character {e.start + 1})"
            ) from None
    return texts


def count_lines(path: Path) -> int:
    """How many lines ``read_lines`` finds in a file (read in blocks: no text kept)."""
    count, last = 0, b"\n"
    try:
        with path.open("rb") as f:
            head = f.read(len(_BOM)).removeprefix(_BOM)
            for block in itertools.chain([head], iter(lambda: f.read(1 << 20), b"")):
                if block:
                    count, last = count + block.count(b"\n"), block[-1:]
    except OSError as e:
        raise TformerError(f"cannot read {path}: {e.strerror or e}") from None
    return count + (last != b"\n")


def file_lines(path: Path) -> Iterator[str]:
    """``read_lines`` of a file, opened on the first line asked for and closed after the last."""
    with path.open("rb") as stream:
        yield from read_lines(stream, str(path))


def translate_chunks(
    run: LoadedRun,
    lines: Iterable[str],
    cfg: DecodeConfig = DEFAULT,
    chunk_size: int = 2000,
    max_tokens: int = 4096,
    use_cache: bool = True,
    max_sentences: int | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> Iterator[list[TextTranslation]]:
    """``translate_texts`` of ``chunk_size`` lines at a time (each chunk sorted by length into
    batches), in input order: the first chunk is ready before the input ends, and memory holds
    one chunk whatever the input's length."""
    lines = iter(lines)
    first = 1
    while chunk := list(itertools.islice(lines, chunk_size)):
        yield translate_texts(
            run, chunk, cfg, max_tokens, use_cache, max_sentences, on_batch, first
        )
        first += len(chunk)


def one_line(text: str) -> str:
    """``text`` with its line breaks made spaces: an output line per input, whatever the
    tokenizer's decoder gives (a run may hold any Hugging Face tokenizer; a byte-level one
    decodes newlines)."""
    return text.replace("\r\n", " ").replace("\r", " ").replace("\n", " ")


def format_translations(
    results: Sequence[TextTranslation], style: str, start: int = 0
) -> list[str]:
    """One line per input (``plain``, ``scores``, ``json``) or per hypothesis (``nbest``);
    ``start``: the index of the first result (``json`` and ``nbest`` lines carry it)."""
    lines = []
    for i, r in enumerate(results, start=start):
        pairs = list(zip(r.translations, r.hypotheses, strict=True))
        if style == "json":
            hyps = [
                {"translation": t, "score": h.score, "logprob": h.logprob, "finished": h.finished}
                for t, h in pairs
            ]
            record = {"index": i, "source": r.source, "hypotheses": hyps, "ms": 1000 * r.seconds}
            lines.append(json.dumps(record, ensure_ascii=False))
        elif style == "nbest":
            lines += [f"{i}\t{h.score:.4f}\t{one_line(t)}" for t, h in pairs]
        elif style == "scores":
            lines.append(f"{pairs[0][1].score:.4f}\t{one_line(pairs[0][0])}")
        else:
            lines.append(one_line(pairs[0][0]))
    return lines


def write_translations(
    chunks: Iterable[Sequence[TextTranslation]], out: BinaryIO, style: str
) -> int:
    """Write each chunk's lines (``format_translations``) as UTF-8 and flush them, so that a
    reader downstream gets them at once. Returns the number of inputs translated."""
    count = 0
    for results in chunks:
        lines = format_translations(results, style, start=count)
        out.write("".join(f"{line}\n" for line in lines).encode("utf-8"))
        out.flush()
        count += len(results)
    return count


def save_translations(path: Path, chunks: Iterable[Sequence[TextTranslation]], style: str) -> int:
    """``write_translations`` into a temporary file that becomes ``path`` after the last chunk
    (``atomic_write``): ``path`` never holds part of the output; an error leaves it as it was."""
    count = 0

    def write(tmp: Path) -> None:
        nonlocal count
        with tmp.open("wb") as out:
            count = write_translations(chunks, out, style)

    atomic_write(path, write, durable=False)  # an output, not run state: no fsync
    return count
