"""``--engine ctranslate2``: a run decoded through its CTranslate2 export (made on first use in
``RUN/ctranslate2/<model.pt hash>-<type>/``), behind ``translate_sources``'s interface.

Where the two differ: tformer's length limit ``a * |src| + b`` is one number per
``translate_batch`` call, so the sources go in one call per limit; CTranslate2's length penalty
divides by ``|Y|^alpha``, not GNMT's ``((5 + |Y|) / 6)^alpha`` (the searches agree at alpha 0);
samples are seeded with ``set_random_seed(seed)``, and epsilon sampling is refused. A
hypothesis' ``logprob`` is CTranslate2's score times the penalty it was divided by.
"""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ctranslate2
import torch
from tokenizers import Tokenizer

from tformer_cli.checkpoint import LoadedRun
from tformer_cli.config import DecodeConfig
from tformer_cli.data.batching import pad
from tformer_cli.data.tokenizer import EOS_ID, SPECIAL_TOKENS, decode
from tformer_cli.decode.reference import Hypothesis, max_lengths
from tformer_cli.decode.search import DEFAULT
from tformer_cli.decode.translate import (
    BATCHING,
    Batching,
    SourcesEngine,
    Translation,
    blank_results,
)
from tformer_cli.errors import TformerError
from tformer_cli.interop.ct2 import ctranslate2_cache, export_ctranslate2, vocabulary

# the run's inference dtype (``LoadedRun.dtype``) -> CTranslate2's weights and compute type
COMPUTE_TYPES = {None: "float32", torch.qint8: "int8", torch.bfloat16: "bfloat16"}
END = SPECIAL_TOKENS[EOS_ID]


def refusal(cfg: DecodeConfig, runs: int = 1, use_cache: bool = True) -> str | None:
    """Why CTranslate2 cannot run the search ``cfg`` over ``runs`` runs; None when it can."""
    cannot = {
        "an ensemble of runs": runs > 1,
        "minimum Bayes risk (--mbr)": cfg.mbr > 0,
        "epsilon sampling (--epsilon)": cfg.sampling is not None
        and cfg.sampling.epsilon is not None,
        "decoding without the KV cache (--no-cache)": not use_cache,
    }
    what = next((name for name, asked in cannot.items() if asked), None)
    return None if what is None else f"CTranslate2 cannot decode {what}: use --engine torch"


@dataclass(frozen=True)
class Ct2Model:
    """A run's CTranslate2 translator, the token string of each id, and the run's positions."""

    translator: ctranslate2.Translator
    tokens: list[str]
    ids: dict[str, int]
    max_positions: int
    folder: Path


def compute_type(run: LoadedRun) -> str:
    """CTranslate2's type for the run's precision, if it has one on the run's device."""
    kind = COMPUTE_TYPES.get(run.dtype)
    if kind is None or kind not in ctranslate2.get_supported_compute_types(run.device.type):
        raise TformerError(
            f"CTranslate2 has no {kind or run.dtype} on this {run.device.type}: use --precision"
            " fp32 (or int8 on a CPU), or --engine torch"
        )
    return kind


def exported(run: LoadedRun, quantization: str) -> Path:
    """The run's export of ``quantization``, made now if model.pt has none yet (the exports of
    earlier model.pt files then go)."""
    folder = ctranslate2_cache(run.run_dir, quantization)
    if (folder / "model.bin").is_file():
        return folder
    try:
        export_ctranslate2(run.run_dir, folder, quantization)
    except (TformerError, OSError):
        if not (folder / "model.bin").is_file():  # else made meanwhile by another process
            raise
    for stale in folder.parent.glob(f"*-{quantization}"):
        if stale != folder:
            shutil.rmtree(stale, ignore_errors=True)
    return folder


def load_ctranslate2(run: LoadedRun) -> Ct2Model:
    """The CTranslate2 translator of ``run`` on its device, precision and CPU threads."""
    if run.device.type not in ("cpu", "cuda"):
        raise TformerError(
            f"CTranslate2 runs on cpu or cuda, not {run.device.type}: use --device cpu,"
            " or --engine torch"
        )
    kind = compute_type(run)
    folder = exported(run, kind)
    translator = ctranslate2.Translator(
        str(folder), device=run.device.type, device_index=run.device.index or 0,
        compute_type=kind, inter_threads=1, intra_threads=torch.get_num_threads(),
    )  # fmt: skip
    tokens = vocabulary(run.tokenizer)
    ids = {token: i for i, token in enumerate(tokens)}
    return Ct2Model(translator, tokens, ids, run.config.model.max_positions, folder)


def ctranslate2_engine(run: LoadedRun) -> SourcesEngine:
    """``translate_on_ct2`` bound to the run's CTranslate2 translator."""
    return functools.partial(translate_on_ct2, load_ctranslate2(run))


def search_options(cfg: DecodeConfig) -> dict[str, Any]:
    """``translate_batch``'s options for the search ``cfg`` (length limit aside)."""
    options: dict[str, Any] = dict(
        beam_size=cfg.beam, num_hypotheses=cfg.nbest, min_decoding_length=cfg.min_len,
        length_penalty=cfg.alpha if cfg.beam > 1 else 0.0, max_input_length=0,
        return_scores=True, return_end_token=True, sampling_topk=1,
    )  # fmt: skip
    if cfg.sampling is not None:
        s = cfg.sampling
        options.update(
            sampling_topk=s.top_k or 0, sampling_topp=s.top_p or 1.0,
            sampling_temperature=s.temperature,
        )  # fmt: skip
    return options


def hypothesis(model: Ct2Model, tokens: list[str], score: float, alpha: float) -> Hypothesis:
    """One CTranslate2 hypothesis as tformer's, its log-probability ``score * |Y|^alpha``."""
    finished = tokens[-1:] == [END]
    ids = [model.ids[t] for t in (tokens[:-1] if finished else tokens)]
    return Hypothesis(ids, score * len(tokens) ** alpha, score, finished)


def limit_groups(
    sources: Sequence[Sequence[int]], real: list[int], cfg: DecodeConfig, max_positions: int
) -> dict[int, list[int]]:
    """The indices ``real`` of ``sources`` by their limit on generated tokens (``max_lengths``)."""
    if not real:
        return {}
    limits = max_lengths(pad([[*sources[i], EOS_ID] for i in real]), cfg, max_positions)
    groups: dict[int, list[int]] = {}
    for i, limit in zip(real, limits.tolist(), strict=True):
        groups.setdefault(limit, []).append(i)
    return groups


def translate_on_ct2(
    model: Ct2Model,
    tokenizer: Tokenizer,
    sources: Sequence[Sequence[int]],
    cfg: DecodeConfig = DEFAULT,
    batching: Batching = BATCHING,
    *,
    on_batch: Callable[[int], None] | None = None,
    first: int = 1,
) -> list[tuple[list[str], Translation]]:
    """``decode.translate.translate_sources`` on CTranslate2; what it cannot do is an error."""
    why = refusal(cfg, use_cache=batching.use_cache)
    if why is not None:
        raise TformerError(why)
    results, real = blank_results(sources, model.max_positions, first, on_batch)
    by_limit = limit_groups(sources, real, cfg, model.max_positions)
    options = search_options(cfg)
    size, unit = (batching.max_sentences, "examples") if batching.max_sentences else (
        batching.max_tokens, "tokens",
    )  # fmt: skip
    if cfg.sampling is not None:
        ctranslate2.set_random_seed(cfg.seed)
    for limit, batch in sorted(by_limit.items()):
        start = time.perf_counter()
        out = model.translator.translate_batch(
            [[model.tokens[t] for t in sources[i]] for i in batch], max_decoding_length=limit,
            max_batch_size=size, batch_type=unit, **options,
        )  # fmt: skip
        seconds = (time.perf_counter() - start) / len(batch)
        for i, r in zip(batch, out, strict=True):
            hyps = [
                hypothesis(model, h, s, options["length_penalty"])
                for h, s in zip(r.hypotheses, r.scores, strict=True)
            ]
            results[i] = Translation(hyps, seconds)
        if on_batch is not None:
            on_batch(len(batch))
    return [(decode(tokenizer, [h.tokens for h in r.hypotheses]), r) for r in results]
