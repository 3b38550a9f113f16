"""What a user asks of an evaluation (``EvalRequest``): the one object that `tformer eval`,
`tformer compare` and `tformer runs` read, and that resolves against a run into the data to load
(``DataChoice``) and the key of its stored result (``EvalKey``)."""

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
    """``config`` as its numbers depend on it: a search that draws nothing (no sampling, no
    minimum Bayes risk over samples) never reads its seed, so eval's and compare's results of
    the same search share one key whatever seed each passed."""
    search = config.search
    draws = search.sampling is not None or (search.mbr > 0 and search.mbr_from == "sample")
    return config if draws else replace(config, search=replace(search, seed=0))


@dataclass(frozen=True)
class DataChoice:
    """The pairs an evaluation reads, resolved against the run: ``spec`` and ``files`` as
    ``load_corpus`` takes them, the split, and ``name``, what the report calls the data."""

    spec: str
    files: dict[str, str | Path | None]
    split: str
    src_lang: str | None
    tgt_lang: str | None
    name: str
    carve_seed: int  # the run's seed, which carves the same valid/test splits as in training


@dataclass(frozen=True)
class EvalRequest:
    """An evaluation of a run, as asked: the data (default: the run's own, with its languages
    and seed, so the same carved splits; ``src_file`` and ``tgt_file``: every pair of two plain
    parallel files, in order), the split and the first ``limit`` pairs of it, the report's
    settings, and where it runs: ``device``; ``precision`` (default: the run's training
    precision); ``threads``, torch CPU threads (0: ``$TFORMER_THREADS`` if set, else the idle
    cores); ``compile``, how the decode step runs; ``engine``, what runs the searches (torch, or
    ctranslate2: the teacher-forced passes stay on torch)."""

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
        """A one-line error when the request names no data and the run has none of its own (an
        imported model: ``train.data`` is ``none``)."""
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
        """The device and compute dtype the run would be evaluated with, as ``load_run``
        resolves them, without loading it."""
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
        return EvalKey(
            file_sha256(run_dir / "model.pt"),
            spec,
            files if any(files) else (),
            data.src_lang,
            data.tgt_lang,
            train.seed,
            data.split,
            self.limit,
            "fp32" if dtype is None else DTYPE_KEYS.get(dtype, str(dtype)),
            device.type,
            keyed(self.config),
            self.engine,
        )
