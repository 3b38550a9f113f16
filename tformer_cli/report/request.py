"""What identifies an evaluation: what a user asks (``EvalRequest``), read by `tformer eval`,
`compare` and `runs`; what it resolves to against a run, the data (``DataChoice``) and the key
of its result (``EvalKey``); and the results kept in ``RUN/evals/<key>.json`` (``StoredEval``),
so that `tformer runs` shows test BLEU and `tformer compare` reuses a current one."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from tformer_cli.checkpoint import RunConfig
from tformer_cli.config import TrainConfig
from tformer_cli.config.decode import ENGINES
from tformer_cli.data.corpus import FILES, PARALLEL_FILES, SPLITS, absolute_data
from tformer_cli.device import resolve_device, resolve_precision
from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_write_text, file_sha256
from tformer_cli.report.evaluation import EvalConfig


def keyed(config: EvalConfig) -> EvalConfig:
    """``config`` as its numbers depend on it: a search that draws nothing never reads its seed,
    so results of the same search share one key whatever seed was passed."""
    search = config.search
    draws = search.sampling is not None or (search.mbr > 0 and search.mbr_from == "sample")
    return config if draws else replace(config, search=replace(search, seed=0))


@dataclass(frozen=True)
class DataChoice:
    """The pairs an evaluation reads: ``spec`` and ``files`` as ``load_corpus`` takes them, the
    split, and ``name``, what the report calls the data."""

    spec: str
    files: dict[str, str | Path | None]
    split: str
    src_lang: str | None
    tgt_lang: str | None
    name: str
    carve_seed: int  # the run's seed, which carves the same valid/test splits as in training


@dataclass(frozen=True)
class EvalRequest:
    """An evaluation of a run, as asked: the data (default: the run's own, its languages and seed,
    so the same carved splits; ``src_file`` and ``tgt_file``: every pair of two plain files),
    split and ``limit``, the report's settings, and where it runs (``precision`` default: the
    run's; ``threads`` 0: ``$TFORMER_THREADS``, else the idle cores; ``engine``: what runs the
    searches, the teacher-forced passes staying on torch)."""

    data: str | None = None
    src_lang: str | None = None
    tgt_lang: str | None = None
    src_file: Path | None = None
    tgt_file: Path | None = None
    split: str = "test"
    limit: int | None = None
    config: EvalConfig = field(default_factory=EvalConfig)
    device: str = "auto"
    precision: str | None = None
    threads: int = 0
    compile: str = "auto"
    engine: str = "torch"

    def check(self) -> None:
        """A one-line error for options that cannot go together, before any work."""
        if self.split not in (*SPLITS, "all"):
            raise TformerError(f"unknown split {self.split!r}: use train, valid, test or all")
        if self.on_files and self.data is not None:
            raise TformerError("give --data or --src-file/--tgt-file, not both")
        if self.engine not in ENGINES:
            raise TformerError(f"unknown engine {self.engine!r}: use {' or '.join(ENGINES)}")

    def check_data(self, run_dir: Path, config: RunConfig) -> None:
        """A one-line error when neither the request nor the (imported) run names data."""
        if self.data is None and not self.on_files and config.imported_from is not None:
            raise TformerError(
                f"{run_dir} was imported from {config.imported_from} and has no data of its own:"
                " pass --data CORPUS, or --src-file and --tgt-file"
            )

    @property
    def on_files(self) -> bool:
        return self.src_file is not None or self.tgt_file is not None

    def data_for(self, train: TrainConfig) -> DataChoice:
        """The data to load for a run trained with ``train``."""
        langs = (self.src_lang or train.src_lang, self.tgt_lang or train.tgt_lang)
        if self.on_files:  # exactly these pairs, in their order
            files = {"src_file": self.src_file, "tgt_file": self.tgt_file}
            name = f"{self.src_file} + {self.tgt_file}"
            return DataChoice(FILES, files, "all", *langs, name, train.seed)
        if self.data is None:  # the run's own data, its parallel files included
            files = {name: getattr(train, name) for name in PARALLEL_FILES}
            return DataChoice(train.data, files, self.split, *langs, train.data, train.seed)
        return DataChoice(self.data, {}, self.split, *langs, self.data, train.seed)

    def precision_for(self, config: RunConfig) -> str:
        return self.precision or config.train.precision

    def placement(self, config: RunConfig) -> tuple[torch.device, torch.dtype | None]:
        """The device and compute dtype ``load_run`` would give the run, without loading it."""
        device = resolve_device(self.device)
        precision = self.precision_for(config)
        return device, resolve_precision(precision, device, config.model.d_model, inference=True)

    def key(
        self, run_dir: Path, config: RunConfig, device: torch.device, dtype: torch.dtype | None
    ) -> EvalKey:
        """What the numbers of this request on ``run_dir`` depend on; hashes model.pt."""
        train, data = config.train, self.data_for(config.train)
        if self.src_file is not None and self.tgt_file is not None:
            both = (self.src_file, self.tgt_file)
            spec, files = FILES, tuple(str(Path(f).resolve()) for f in both)
        elif self.data is None:
            spec, files = train.data, tuple(getattr(train, name) for name in PARALLEL_FILES)
        else:
            spec, files = absolute_data(self.data), ()
        precision = "fp32" if dtype is None else DTYPE_KEYS.get(dtype, str(dtype))
        return EvalKey(
            file_sha256(run_dir / "model.pt"), spec, files if any(files) else (), data.src_lang,
            data.tgt_lang, train.seed, data.split, self.limit, precision, device.type,
            keyed(self.config), self.engine,
        )  # fmt: skip


# ---------------------------------------------------------------------------- kept results
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
