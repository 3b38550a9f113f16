"""What ``tformer serve`` does with its run, for the server (``tformer_cli.serve``): load it,
describe it, count a request's source tokens, and answer translations, attention maps and
traces as the objects of the commands' JSON. The server owns HTTP: requests, batching, limits.

``translate_texts``, ``Batching``, ``LoadedRun`` and ``SourcesEngine`` are the names the
server's model thread decodes with."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from tformer_cli.api.decoding import load_engine
from tformer_cli.api.run import Run, load
from tformer_cli.checkpoint import LoadedRun
from tformer_cli.config import DecodeConfig
from tformer_cli.data.corpus import PARALLEL_FILES, corpus_within
from tformer_cli.data.tokenizer import encode
from tformer_cli.decode.streams import format_translations
from tformer_cli.decode.translate import Batching, SourcesEngine, TextTranslation, translate_texts
from tformer_cli.device import precision_name
from tformer_cli.errors import TformerError
from tformer_cli.report.attention.maps import KINDS
from tformer_cli.report.attention.render import to_json
from tformer_cli.report.attention.view import attend, summary_rows
from tformer_cli.report.eval_run import use_threads

__all__ = [
    "Batching",
    "LoadedRun",
    "SourcesEngine",
    "attention_record",
    "load_served",
    "model_facts",
    "source_lengths",
    "trace_record",
    "translate_texts",
    "translation_records",
]


def load_served(
    model: Path | None, device: str, precision: str | None, engine: str, threads: int = 0
) -> tuple[LoadedRun, SourcesEngine | None]:
    """The run to serve (default: the newest) in ``precision`` (default: its own), on
    ``threads`` CPU threads as ``tformer eval`` (``use_threads``), and what translates it:
    ``None`` (tformer's search) for torch, or its CTranslate2 export (on those threads)."""
    run = load(model, device=device, precision=precision).loaded[0]
    use_threads(threads)
    return run, load_engine(engine, run)


def example_text(run: LoadedRun) -> str:
    """A sentence of the run's own data for the page to start with: the shortest of the first
    100 source sentences of its valid split; "" where the data is remote (``hf:``) or unreadable."""
    train = run.config.train
    if train.data.startswith("hf:"):
        return ""
    files = {name: getattr(train, name) for name in PARALLEL_FILES}
    langs = {"src_lang": train.src_lang, "tgt_lang": train.tgt_lang}
    try:
        with corpus_within(train.data, **langs, seed=train.seed, **files) as corpus:
            return min(corpus["valid"]["src"][:100], key=len, default="")
    except (TformerError, OSError, ValueError):
        return ""


def model_facts(run: LoadedRun) -> dict[str, Any]:
    """The run as ``GET /model`` describes it: its name, device, precision, size, attention
    kinds, settings and an example sentence."""
    m = run.model
    return {
        "run": run.run_dir.name,
        "device": str(run.device),
        "precision": precision_name(run.device, run.dtype),
        "parameters": sum(p.numel() for p in m.parameters()),
        "layers": {"encoder": len(m.encoder), "decoder": len(m.decoder)},
        "heads": m.cfg.h,
        "kinds": list(KINDS),
        "config": dataclasses.asdict(run.config),
        "example": example_text(run),
    }


def source_lengths(run: LoadedRun, texts: list[str]) -> list[int]:
    """The source tokens of each text, its ``</s>`` included, as the model reads it."""
    return [len(ids) + 1 for ids in encode(run.tokenizer, texts)]


def translation_records(results: list[TextTranslation]) -> list[dict[str, Any]]:
    """The objects of ``tformer translate --json``, one per text."""
    return [json.loads(line) for line in format_translations(results, "json")]


def attention_record(run: LoadedRun, text: str, cfg: DecodeConfig) -> dict[str, Any]:
    """What ``tformer inspect-attention --json`` writes for ``text``: every kind's weights with
    their token labels, and the per-head summary of cross-attention."""
    maps = attend(run, text, cfg)
    return json.loads(to_json(maps, summary_rows(maps, "cross")))


def trace_record(run: Run, text: str, cfg: DecodeConfig, top: int) -> dict[str, Any]:
    """What ``tformer translate --trace`` writes for ``text``: the step-through search."""
    return run.trace(text, beam=cfg.beam, top=top, alpha=cfg.alpha).to_dict()
