"""Kept evaluations: each ``tformer eval`` result in ``RUN/evals/<key>.json``, with both
searches' outputs, keyed by what its numbers depend on, so that `tformer runs` shows test BLEU
and `tformer compare` reuses a current result."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from tformer_cli.files import atomic_write_text
from tformer_cli.report.evaluation import EvalConfig

EVALS = "evals"  # RUN/evals/<key>.json: each `tformer eval` result, with its outputs
DTYPE_KEYS = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.qint8: "int8"}


@dataclass(frozen=True)
class EvalKey:
    """What an evaluation's numbers depend on: the weights (SHA-256 of model.pt), the data (spec,
    languages, plain files, the run's seed that carves missing splits), split, limit, precision,
    device type and every ``EvalConfig`` setting; not threads or batch order (float rounding)."""

    model_sha256: str
    data: str
    files: tuple[str | None, ...]  # the run's --src-file/--tgt-file/--valid-*-file, if it used them
    src_lang: str | None
    tgt_lang: str | None
    seed: int
    split: str
    limit: int | None
    precision: str  # fp32, bf16 (the autocast dtype asked for) or int8
    device: str  # cpu, cuda or mps
    config: EvalConfig
    engine: str = "torch"  # what ran the searches: torch, or ctranslate2

    @property
    def digest(self) -> str:
        """The stored result's name, ``RUN/evals/<digest>.json``."""
        raw = dataclasses.asdict(self)
        if raw["engine"] == "torch":  # a torch result keeps the key it had before engines
            del raw["engine"]
        text = json.dumps(raw, sort_keys=True)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


@dataclass(frozen=True)
class StoredEval:
    """A kept evaluation: its key as JSON, the report as ``--json`` writes it, and the outputs
    with their references, so that paired significance tests need no new decoding."""

    key: str
    request: dict[str, Any]  # its EvalKey as JSON
    created: str  # local time, ISO 8601
    report: dict[str, Any]
    greedy: list[str]
    beam: list[str] | None
    refs: list[str]

    @property
    def model_sha256(self) -> str:
        return str(self.request.get("model_sha256", ""))


def stored_eval_path(run_dir: Path, key: str) -> Path:
    return run_dir / EVALS / f"{key}.json"


def keep_eval(run_dir: Path, stored: StoredEval) -> Path:
    """Write ``stored`` to ``RUN/evals/<key>.json`` atomically (cheap to remake: not synced)."""
    path = stored_eval_path(run_dir, stored.key)
    text = json.dumps(dataclasses.asdict(stored), ensure_ascii=False) + "\n"
    atomic_write_text(path, text, durable=False)
    return path


def read_stored_eval(path: Path) -> StoredEval | None:
    """A stored evaluation, or ``None`` when the file is missing, unreadable or not one."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        stored = StoredEval(**raw)
        texts = [stored.greedy, stored.refs, *([stored.beam] if stored.beam is not None else [])]
        lists = all(isinstance(t, list) and len(t) == len(stored.refs) for t in texts)
        if not (lists and isinstance(stored.request, dict) and isinstance(stored.report, dict)):
            return None
        datetime.fromisoformat(stored.created)
        return stored
    except (OSError, ValueError, TypeError):  # missing, not UTF-8 or JSON, other fields
        return None


def stored_evals(run_dir: Path) -> list[StoredEval]:
    """Every readable stored evaluation of a run, newest first."""
    found = [read_stored_eval(p) for p in sorted((run_dir / EVALS).glob("*.json"))]
    kept = [s for s in found if s is not None]
    return sorted(kept, key=lambda s: datetime.fromisoformat(s.created).timestamp(), reverse=True)


def load_stored_eval(run_dir: Path, key: EvalKey) -> StoredEval | None:
    """The stored result of exactly ``key`` (so of the current model.pt), if kept."""
    stored = read_stored_eval(stored_eval_path(run_dir, key.digest))
    if stored is None or stored.key != key.digest:
        return None
    return stored if stored.model_sha256 == key.model_sha256 else None
