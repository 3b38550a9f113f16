"""What a user asks of an evaluation (``EvalRequest``), read by `tformer eval`, `compare` and
`runs`, and what it resolves to against a run: the data (``DataChoice``), the key of its stored
result (``EvalKey``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from tformer_cli.checkpoint import RunConfig
from tformer_cli.config import TrainConfig
from tformer_cli.config.decode import ENGINES
from tformer_cli.data.corpus import FILES, PARALLEL_FILES, SPLITS, absolute_data
from tformer_cli.device import resolve_device, resolve_precision
from tformer_cli.errors import TformerError
from tformer_cli.files import file_sha256
from tformer_cli.report.evaluation import EvalConfig
from tformer_cli.report.stored import DTYPE_KEYS, EvalKey


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
