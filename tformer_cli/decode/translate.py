"""Translation of token lists and texts in length-sorted batches, with minimum Bayes risk
reranking on top of the search."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from tokenizers import Tokenizer

from tformer_cli.checkpoint import LoadedRun
from tformer_cli.config import DecodeConfig, SamplingConfig
from tformer_cli.data.batching import pad, token_batches
from tformer_cli.data.tokenizer import EOS_ID, decode, encode
from tformer_cli.decode.fast import search_threads
from tformer_cli.decode.mbr import mbr_select
from tformer_cli.decode.reference import Hypothesis
from tformer_cli.decode.search import DEFAULT, Models, as_list, batched_beam, batched_greedy
from tformer_cli.device import inference
from tformer_cli.errors import TformerError


@dataclass(frozen=True)
class Batching:
    """How sources are batched and decoded, which leaves the translations as they are (up to
    rounding): at most ``max_tokens`` source tokens and ``max_sentences`` sentences (None: any
    number) per batch, sorted by length; ``use_cache`` False decodes the whole prefix again at
    every step instead of reading the KV cache (slow; for teaching and comparison)."""

    max_tokens: int = 4096
    max_sentences: int | None = None
    use_cache: bool = True


BATCHING = Batching()


@dataclass(frozen=True)
class Translation:
    """The n-best hypotheses of one input, and the decoding time of its batch per sentence."""

    hypotheses: list[Hypothesis]
    seconds: float


def blank_results(
    sources: Sequence[Sequence[int]],
    limit: int,
    first: int,
    on_batch: Callable[[int], None] | None,
) -> tuple[list[Translation], list[int]]:
    """An empty translation for each source, kept for blank ones (``on_batch`` hears of them),
    and the indices of the others; an error naming the first source longer than ``limit``
    tokens, ``</s>`` included, by its number counted from ``first``."""
    too_long = next((i for i, s in enumerate(sources) if len(s) + 1 > limit), None)
    if too_long is not None:
        raise TformerError(
            f"input {first + too_long} has {len(sources[too_long]) + 1} tokens;"
            f" this model reads at most {limit}"
        )
    real = [i for i, s in enumerate(sources) if s]
    if on_batch is not None and len(real) < len(sources):
        on_batch(len(sources) - len(real))
    return [Translation([Hypothesis([], 0.0, 0.0)], 0.0)] * len(sources), real


def translate_ids(
    model: Models,
    sources: Sequence[Sequence[int]],
    cfg: DecodeConfig = DEFAULT,
    batching: Batching = BATCHING,
    *,
    on_batch: Callable[[int], None] | None = None,
    first: int = 1,
    compile: str = "auto",
) -> list[Translation]:
    """Translate token lists (no ``</s>``) in length-sorted batches; results in input order
    (``blank_results``: blank inputs, too long ones). ``on_batch(n)`` is called after each batch
    of n sentences; samples are drawn from one generator seeded with ``cfg.seed``."""
    models = as_list(model)
    device = next(models[0].parameters()).device
    generator = torch.Generator(device).manual_seed(cfg.seed) if cfg.sampling else None
    limit = min(m.cfg.max_positions for m in models)
    results, real = blank_results(sources, limit, first, on_batch)
    rows = cfg.nbest if cfg.sampling is not None else cfg.beam  # per sentence
    lengths = [len(sources[i]) + 1 for i in real]
    for sub in token_batches(lengths, batching.max_tokens, max_sentences=batching.max_sentences):
        batch = [real[j] for j in sub]
        start = time.perf_counter()
        src = pad([[*sources[i], EOS_ID] for i in batch]).to(device)
        with search_threads(device, len(batch) * rows):  # as ``search``, without its frame
            if cfg.beam == 1:
                nbest = batched_greedy(models, src, cfg, batching.use_cache, compile, generator)
            else:
                nbest = batched_beam(models, src, cfg, batching.use_cache, compile)
        seconds = (time.perf_counter() - start) / len(batch)
        for i, hyps in zip(batch, nbest, strict=True):
            results[i] = Translation(hyps, seconds)
        if on_batch is not None:
            on_batch(len(batch))
    return results


@dataclass(frozen=True)
class TextTranslation:
    """One input's n-best translations (detokenized) with their hypotheses, and timing."""

    source: str
    translations: list[str]
    hypotheses: list[Hypothesis]
    seconds: float


def describe(cfg: DecodeConfig) -> str:
    """What a search is, in a few words: ``greedy``, ``beam 5``, ``sampling (T 0.7, top-p
    0.9)``, ``MBR chrF over 16 samples``."""
    if cfg.mbr:
        source = "beam n-best" if cfg.mbr_from == "beam" else "samples"
        utility = {"chrf": "chrF", "bleu": "BLEU"}[cfg.mbr_utility]
        return f"MBR {utility} over {cfg.mbr} {source}"
    if cfg.sampling is not None:
        d = cfg.sampling
        parts = [f"T {d.temperature:g}"] + [
            f"{name} {value:g}"
            for name, value in (("top-k", d.top_k), ("top-p", d.top_p), ("epsilon", d.epsilon))
            if value is not None
        ]
        return f"sampling ({', '.join(parts)})"
    return "greedy" if cfg.beam == 1 else f"beam {cfg.beam}"


def search_config(cfg: DecodeConfig) -> DecodeConfig:
    """The search behind ``cfg``: itself, or with ``cfg.mbr`` the one that finds ``cfg.mbr``
    candidates per input: samples (``cfg.sampling``, else plain ancestral sampling), or the
    n-best list of a beam at least that wide."""
    if not cfg.mbr:
        return cfg
    if cfg.mbr_from == "beam":
        return dataclasses.replace(cfg, beam=max(cfg.beam, cfg.mbr), nbest=cfg.mbr, sampling=None)
    return dataclasses.replace(
        cfg, beam=1, nbest=cfg.mbr, sampling=cfg.sampling or SamplingConfig()
    )


def mbr_rerank(
    texts: list[str], hyps: list[Hypothesis], utility: str
) -> tuple[list[str], list[Hypothesis]]:
    """The candidates by expected utility against each other (``mbr_select``), best first; each
    hypothesis' ``score`` becomes its expected utility (0-100), its ``logprob`` stays."""
    _, expected = mbr_select(texts, utility)
    order = sorted(range(len(texts)), key=lambda i: -expected[i])  # stable: ties keep their order
    return [texts[i] for i in order], [
        dataclasses.replace(hyps[i], score=expected[i]) for i in order
    ]


def detokenized(
    tokenizer: Tokenizer, found: Translation, cfg: DecodeConfig
) -> tuple[list[str], Translation]:
    """The n-best of a search of ``search_config(cfg)`` as text; with ``cfg.mbr``, the minimum
    Bayes risk choice first (``mbr_rerank``), ``cfg.nbest`` kept."""
    texts, hyps = decode(tokenizer, [h.tokens for h in found.hypotheses]), found.hypotheses
    if cfg.mbr:
        texts, hyps = mbr_rerank(texts, hyps, cfg.mbr_utility)
        texts, hyps = texts[: cfg.nbest], hyps[: cfg.nbest]
    return texts, Translation(hyps, found.seconds)


def translate_sources(
    models: Models,
    tokenizer: Tokenizer,
    sources: Sequence[Sequence[int]],
    cfg: DecodeConfig = DEFAULT,
    batching: Batching = BATCHING,
    *,
    on_batch: Callable[[int], None] | None = None,
    first: int = 1,
    compile: str = "auto",
) -> list[tuple[list[str], Translation]]:
    """``translate_ids`` and the detokenized n-best of each input; with ``cfg.mbr``, the
    minimum Bayes risk choice among ``cfg.mbr`` candidates first (``cfg.nbest`` kept)."""
    found = translate_ids(
        models,
        sources,
        search_config(cfg),
        batching,
        on_batch=on_batch,
        first=first,
        compile=compile,
    )
    return [detokenized(tokenizer, r, cfg) for r in found]


class SourcesEngine(Protocol):
    """``translate_sources`` with its models bound: tformer's search, or another engine's
    (``--engine ctranslate2``: ``interop/engine.py``)."""

    def __call__(
        self,
        tokenizer: Tokenizer,
        sources: Sequence[Sequence[int]],
        cfg: DecodeConfig,
        batching: Batching,
        *,
        on_batch: Callable[[int], None] | None,
        first: int,
    ) -> list[tuple[list[str], Translation]]: ...


def translate_texts(
    run: LoadedRun | Sequence[LoadedRun],
    texts: Sequence[str],
    cfg: DecodeConfig = DEFAULT,
    batching: Batching = BATCHING,
    *,
    on_batch: Callable[[int], None] | None = None,
    first: int = 1,
    engine: SourcesEngine | None = None,
) -> list[TextTranslation]:
    """Tokenize, translate and detokenize sentences with a loaded run (or an ensemble of runs
    sharing a tokenizer), in input order; ``engine``: what translates the token lists (default:
    tformer's search, as ``translate_sources``)."""
    runs = [run] if isinstance(run, LoadedRun) else list(run)
    lead = runs[0]
    with inference(lead.device, lead.dtype):
        sources = encode(lead.tokenizer, texts)
        if engine is not None:
            results = engine(lead.tokenizer, sources, cfg, batching, on_batch=on_batch, first=first)
        else:  # ``translate_sources`` written out: one frame fewer above the model
            models = [r.model for r in runs]
            search = search_config(cfg)
            found = translate_ids(
                models,
                sources,
                search,
                batching,
                on_batch=on_batch,
                first=first,
                compile=lead.compile,
            )
            results = [detokenized(lead.tokenizer, r, cfg) for r in found]
    return [
        TextTranslation(text, out, r.hypotheses, r.seconds)
        for text, (out, r) in zip(texts, results, strict=True)
    ]
