"""The run directory: one trained model = one folder, written atomically, loaded safely.

runs/<name>/
  config.json     model, training and data settings + tformer version
  tokenizer.json  the trained tokenizer (of an imported model: the source side's)
  target_tokenizer.json  an imported model's target-side tokenizer, same vocabulary (optional)
  model.pt        best weights (state_dict only)
  last.pt         weights + optimizer + progress (step, budget), for --resume
  log.jsonl       one JSON object per logged step / validation
  checkpoints/    with --average N: the weights of the last N validations, step-NNNNNN.pt

A run is named by its folder, or by a name under ``runs/`` (``resolve_run``). Importing this
module imports no torch, so the command line checks the runs it is given before torch loads.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer

from tformer_cli import __version__
from tformer_cli.config import ModelConfig, TrainConfig, from_dict
from tformer_cli.data.tokenizer import load_tokenizer
from tformer_cli.errors import TformerError, first_line
from tformer_cli.files import atomic_write, atomic_write_text

if TYPE_CHECKING:
    import torch

    from tformer_cli.model import Transformer

RUNS_DIR = Path("runs")
TARGET_TOKENIZER = "target_tokenizer.json"
RUN_FORMAT = 1  # bump when the run folder's layout or the state_dict's keys change


def torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` through a Python file: a failed write is an ``OSError``."""
    import torch

    with open(path, "wb") as f:
        torch.save(obj, f)


def atomic_torch_save(path: Path, obj: Any) -> None:
    atomic_write(path, lambda tmp: torch_save(obj, tmp))


@dataclass(frozen=True)
class RunConfig:
    """The contents of ``config.json``."""

    model: ModelConfig
    train: TrainConfig
    version: str = __version__
    format: int = RUN_FORMAT
    imported_from: str | None = None  # a model made elsewhere (tformer import): where from

    def save(self, run_dir: Path) -> None:
        raw = dataclasses.asdict(self)
        if raw["imported_from"] is None:  # a trained run's config.json as before
            del raw["imported_from"]
        atomic_write_text(run_dir / "config.json", json.dumps(raw, indent=2) + "\n")

    @classmethod
    def load(cls, run_dir: Path) -> RunConfig:
        path = run_dir / "config.json"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(raw, dict) or "format" not in raw:
                raise TformerError(f"{path} is not a tformer run's config (no run format in it)")
            fmt = raw["format"]
            if fmt != RUN_FORMAT:
                raise TformerError(
                    f"{path}: run format {fmt} from tformer {raw.get('version')} "
                    f"cannot be read by tformer {__version__} (format {RUN_FORMAT}); retrain it"
                )
            try:
                model = from_dict(ModelConfig, raw["model"])
                train = from_dict(TrainConfig, raw["train"])
            except TformerError as e:  # a field of the wrong type or out of range
                raise TformerError(f"{path} is corrupt ({e})") from None
            imported = raw.get("imported_from")
            if imported is not None and not isinstance(imported, str):
                raise TformerError(f"{path} is corrupt (imported_from is not a string)")
            return cls(model, train, raw["version"], fmt, imported)
        except FileNotFoundError:
            trained = ("model.pt", "last.pt", "log.jsonl")
            if any((run_dir / name).is_file() for name in trained):
                raise TformerError(
                    f"{path} is missing: the run's weights are there, but cannot be read"
                    " without their settings (restore the file from a copy)"
                ) from None
            if (run_dir / "tokenizer.json").is_file():  # killed between the two first writes
                raise TformerError(
                    f"{run_dir} stopped before training began (a tokenizer.json, no config.json):"
                    " nothing to resume; train it again with the same --name"
                ) from None
            raise TformerError(f"{run_dir} is not a tformer run (no config.json)") from None
        except (ValueError, KeyError, TypeError, AttributeError) as e:  # bad JSON, UTF-8, fields
            raise TformerError(f"{path} is corrupt ({type(e).__name__}: {e})") from None


def check_checkpoint(path: Path) -> None:
    """A one-line error unless ``path`` is a whole ``torch.save`` archive (a zip), unread."""
    if not path.is_file():
        raise TformerError(f"{path} is missing: train the run first (tformer train)")
    if not zipfile.is_zipfile(path):
        raise TformerError(
            f"{path} is corrupt or not a tformer checkpoint (not a whole torch.save archive:"
            " truncated, empty or another kind of file)"
        )


def load_state(path: Path) -> dict[str, Any]:
    """``torch.load`` with ``weights_only=True`` (a checkpoint never runs code); one-line errors."""
    import torch

    check_checkpoint(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # torch's hint to load with weights_only=False: not here
        raise TformerError(
            f"{path} is not a tformer checkpoint: it holds objects other than tensors and"
            " numbers, which tformer does not load"
        ) from None
    except Exception as e:  # torch raises many types for truncated or foreign files
        raise TformerError(
            f"{path} is corrupt or not a tformer checkpoint ({first_line(e)})"
        ) from None


CHECKPOINTS = "checkpoints"
_CHECKPOINT_NAME = re.compile(r"step-(\d+)\.pt")


def checkpoint_paths(run_dir: Path) -> list[Path]:
    """The run's validation checkpoints ``checkpoints/step-NNNNNN.pt``, oldest first."""
    found = [
        (int(m[1]), p)
        for p in (run_dir / CHECKPOINTS).glob("step-*.pt")
        if (m := _CHECKPOINT_NAME.fullmatch(p.name))
    ]
    return [p for _, p in sorted(found)]


def save_checkpoint(run_dir: Path, step: int, state: dict[str, Any], keep: int) -> None:
    """Write ``checkpoints/step-<step>.pt`` atomically, then delete all but the ``keep`` newest."""
    atomic_torch_save(run_dir / CHECKPOINTS / f"step-{step:06d}.pt", state)
    for old in checkpoint_paths(run_dir)[:-keep]:
        old.unlink(missing_ok=True)


def average_state_dicts(states: Iterable[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of state dicts with equal keys and shapes, summed in fp32, read
    one at a time (each tensor keeps its dtype)."""
    import torch

    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    n = 0
    for n, state in enumerate(states, start=1):
        if n == 1:
            total = {k: v.detach().to(torch.float32, copy=True) for k, v in state.items()}
            dtypes = {k: v.dtype for k, v in state.items()}
            continue
        if state.keys() != total.keys():
            raise TformerError("the checkpoints to average hold different parameters")
        for k, v in state.items():
            if v.shape != total[k].shape:
                raise TformerError(f"the checkpoints to average differ in the shape of {k}")
            total[k] += v.float()
    return {k: (v / n).to(dtypes[k]) for k, v in total.items()}


def average_run(
    run: Path, last: int, output: Path | None = None, runs_dir: Path = RUNS_DIR
) -> tuple[list[Path], Path]:
    """Average a run's ``last`` checkpoints into ``output``: (those averaged, the file)."""
    run_dir = resolve_run(run, runs_dir)
    paths = checkpoint_paths(run_dir)[-last:]
    if len(paths) < 2:
        raise TformerError(
            f"{run_dir / CHECKPOINTS} holds {len(paths)} checkpoint(s); averaging needs at least 2"
            " (train with --average N)"
        )
    target = output or run_dir / "averaged.pt"
    atomic_torch_save(target, average_state_dicts(load_state(p) for p in paths))
    return paths, target


STAMP = "%Y%m%d-%H%M%S"  # of train's run names without --name: DATA-YYYYMMDD-HHMMSS
_STAMPED = re.compile(r"-\d{8}-\d{6}")


def latest_run(name: str, runs_dir: Path = RUNS_DIR) -> Path | None:
    """The newest ``runs_dir/NAME-YYYYMMDD-HHMMSS`` (a run trained without ``--name``), if any."""
    stamped = [
        p.name
        for p in (runs_dir.iterdir() if runs_dir.is_dir() else [])
        if p.name.startswith(name) and _STAMPED.fullmatch(p.name[len(name) :]) and p.is_dir()
    ]
    return runs_dir / max(stamped) if stamped else None


def resolve_run(model: Path, runs_dir: Path = RUNS_DIR) -> Path:
    """The run folder ``model`` names: a folder, ``runs_dir/NAME`` or ``latest_run``."""
    if model.is_dir():
        return model
    if model.exists():
        raise TformerError(f"{model} is a file; give a run folder (runs/NAME)")
    if len(model.parts) > 1:  # a path, not a name
        raise TformerError(f"run folder {model} does not exist: see tformer runs")
    if (runs_dir / model).is_dir():
        return runs_dir / model
    stamped = latest_run(model.name, runs_dir)
    if stamped is None:
        named = runs_dir / model
        raise TformerError(
            f"run folder {model} does not exist (nor {named}, nor {named}-YYYYMMDD-HHMMSS):"
            " see tformer runs"
        )
    return stamped


@dataclass
class LoadedRun:
    """A trained run ready for inference; ``compile``: how its decode step runs (``--compile``)."""

    run_dir: Path
    config: RunConfig
    model: Transformer
    tokenizer: Tokenizer
    device: torch.device
    dtype: torch.dtype | None
    compile: str = "auto"
    target_tokenizer: Tokenizer | None = None  # an imported model's own for the target side

    @property
    def tgt_tokenizer(self) -> Tokenizer:
        """The tokenizer that encodes targets: the target side's own, else the shared one."""
        return self.target_tokenizer or self.tokenizer


def for_inference(net: Transformer, device: torch.device, dtype: torch.dtype | None) -> Transformer:
    """``net`` (eval mode, on ``device``) as inference runs it: int8 Linear layers
    (``torch.qint8``), else column-major weights on the CPU, or bf16 weights on a GPU in bf16."""
    import torch

    from tformer_cli.model.fast import column_major, quantize_int8

    if dtype == torch.qint8:
        return quantize_int8(net)
    if device.type == "cpu":
        return column_major(net)
    return net.to(torch.bfloat16) if dtype == torch.bfloat16 else net


def load_weights(net: torch.nn.Module, run_dir: Path) -> None:
    """Load ``run_dir/model.pt`` into ``net``; a mismatch is a one-line error."""
    try:
        net.load_state_dict(load_state(run_dir / "model.pt"))
    except (RuntimeError, TypeError, AttributeError) as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [repr(e)]
        first = lines[1] if len(lines) > 1 and lines[0].startswith("Error(s) in") else lines[0]
        first = first if len(first) <= 160 else first[:157] + "..."  # key lists run long
        raise TformerError(f"{run_dir}/model.pt does not match config.json: {first}") from None


def load_run(
    model: Path, device: str = "auto", precision: str = "fp32", compile: str = "auto"
) -> LoadedRun:
    """Load a run's ``model.pt`` and tokenizers, ready for inference (``for_inference``)."""
    from tformer_cli.compile import check_mode
    from tformer_cli.device import resolve_device, resolve_precision, setup_threads
    from tformer_cli.model import Transformer

    run_dir = resolve_run(model)
    config = RunConfig.load(run_dir)
    tokenizer = load_tokenizer(run_dir / "tokenizer.json")
    target = run_dir / TARGET_TOKENIZER
    target_tokenizer = load_tokenizer(target) if target.is_file() else None
    for name, tok in (("tokenizer.json", tokenizer), (TARGET_TOKENIZER, target_tokenizer)):
        if tok is not None and tok.get_vocab_size() != config.model.vocab_size:
            raise TformerError(f"{run_dir}: {name} does not match config.json (vocabulary size)")
    net = Transformer(config.model)
    load_weights(net, run_dir)
    setup_threads()
    dev = resolve_device(device)
    dtype = resolve_precision(precision, dev, config.model.d_model, inference=True)
    net = for_inference(net.to(dev).eval(), dev, dtype)
    return LoadedRun(
        run_dir, config, net, tokenizer, dev, dtype, check_mode(compile), target_tokenizer
    )


def load_runs(
    models: Sequence[Path],
    device: str = "auto",
    precision: str = "fp32",
    compile: str = "auto",
) -> list[LoadedRun]:
    """``load_run`` of each run: several decode as an ensemble (``shared_tokenizer``)."""
    return shared_tokenizer([load_run(m, device, precision, compile) for m in models])


def shared_tokenizer(runs: list[LoadedRun]) -> list[LoadedRun]:
    """``runs``, if they share one tokenizer, as an ensemble's runs must; else a one-line error."""
    for run in runs[1:]:
        if run.tokenizer.to_str() != runs[0].tokenizer.to_str():
            raise TformerError(
                f"{run.run_dir} and {runs[0].run_dir} have different tokenizers: an ensemble's"
                " runs must share one (train them with --tokenizer-file)"
            )
    return runs
