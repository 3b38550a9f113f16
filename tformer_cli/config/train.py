"""What ``tformer train`` needs besides the model's shape, its options (declared by the fields'
metadata), and the shipped recipes."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_type_hints

from tformer_cli.config.decode import MAX_SEED
from tformer_cli.config.fields import MODES, Checked, OneOf, Range, from_dict, setting
from tformer_cli.config.model import ModelConfig
from tformer_cli.errors import SettingError, TformerError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DECAYS = ("auto", "rsqrt", "linear", "cosine")
MAX_VOCAB = 1_000_000  # subword types: past this, tokenizer training runs out of memory first
TOKENIZERS = ("bpe", "unigram", "wordlevel")
SCHEDULES = ("off", "linear", "exp", "inverse-sigmoid")  # scheduled sampling
DEVICES = ("auto", "cpu", "cuda", "mps")
PRECISIONS = ("fp32", "bf16", "auto")
AT_LEAST_1, AT_LEAST_0 = Range(1), Range(0)
# the constant k of each schedule: linear 1-k*i, exp k^i, inverse-sigmoid k/(k+e^(i/k))
SS_K = {"linear": AT_LEAST_0, "exp": Range(0, 1, low_open=True), "inverse-sigmoid": AT_LEAST_1}


@dataclass(frozen=True)
class TrainConfig(Checked):
    """Everything `tformer train` needs besides the model shape."""

    # "files" when the data are the plain parallel files below
    data: str = setting(
        "toy",
        "toy (bundled), a folder, a .tsv/.jsonl file, or hf:NAME[:CONFIG] (or --src-file and"
        " --tgt-file).",
    )
    src_lang: str | None = setting(None, "Source language suffix of plain files.", "src")
    tgt_lang: str | None = setting(None, "Target language suffix of plain files.", "tgt")
    # with tgt_file: plain parallel files, the train split
    src_file: str | None = setting(
        None,
        "Plain source file (one sentence a line, e.g. train.de), the train split with"
        " --tgt-file, instead of --data; valid/test are carved from it unless given.",
        path=True,
    )
    tgt_file: str | None = setting(
        None, "Plain target file, line by line with --src-file.", path=True
    )
    # with valid_tgt_file: the valid split, from any data
    valid_src_file: str | None = setting(
        None, "Plain source file of the valid split, with --valid-tgt-file.", path=True
    )
    valid_tgt_file: str | None = setting(None, "Plain target file of the valid split.", path=True)
    vocab_size: int = setting(1000, "Shared subword vocabulary size.", values=Range(1, MAX_VOCAB))
    tokenizer_kind: str = setting(
        "bpe", "bpe, unigram or wordlevel.", "tokenizer", values=OneOf(TOKENIZERS)
    )
    tokenizer_sample: int = setting(
        1_000_000, "Train the tokenizer on at most N sentences (0: all).", values=AT_LEAST_0
    )
    # stored as an absolute path
    tokenizer_file: str | None = setting(
        None,
        "Use this tokenizer (from tformer tokenizer train, or any tokenizers JSON with <pad>=0"
        " <unk>=1 <s>=2 </s>=3) instead of training one.",
        path=True,
    )
    # stored as an absolute path
    init_from: str | None = setting(
        None,
        "Fine-tune: start from this run's weights and tokenizer, with its model settings (a"
        " new optimizer and schedule).",
        path=True,
        metavar="RUN",
    )
    max_tokens: int = setting(2048, "Batch size in padded tokens.", values=AT_LEAST_1)
    max_len: int = setting(256, "Skip longer training pairs (tokens).", values=AT_LEAST_1)
    lr: float = setting(2e-3, "Peak learning rate (AdamW).", values=Range(0, low_open=True))
    warmup: int = setting(200, "Warm-up steps, then --decay.", values=AT_LEAST_1)
    decay: str = setting(  # auto: linear with a time budget (Li et al. 2020)
        "auto",
        "After warm-up: rsqrt (1/sqrt, the paper's), linear or cosine to 0 at the end of"
        " --max-minutes or --max-steps, or auto (linear with --max-minutes, else rsqrt).",
        values=OneOf(DECAYS),
    )
    label_smoothing: float = setting(0.1, "Label smoothing.", values=Range(0, 1, high_open=True))
    clip_norm: float = setting(1.0, "Max gradient norm (0: off).", values=AT_LEAST_0)
    accum: int = setting(1, "Batches per update.", values=AT_LEAST_1)
    max_steps: int = setting(0, "Stop after N updates (0: none).", values=AT_LEAST_0)
    max_epochs: int = setting(6, "Stop after N epochs (0: none).", "epochs", values=AT_LEAST_0)
    max_minutes: float = setting(0.0, "Stop after this time.", values=AT_LEAST_0)
    valid_every: int = setting(250, "Validate every N updates.", values=AT_LEAST_1)
    valid_bleu_size: int = setting(300, "Validation sentences for BLEU.", values=AT_LEAST_1)
    save_every: float = setting(
        5.0,
        "Save last.pt at least every N minutes, besides each validation (0: only at"
        " validations). A killed run loses at most this much work.",
        values=AT_LEAST_0,
    )
    patience: int = setting(
        0, "Early stop after N validations without gain (0: off).", values=AT_LEAST_0
    )
    average: int = setting(
        0,
        "Keep the last N validation checkpoints; at the end their mean becomes model.pt if it"
        " validates at least as well as the best one (0: off).",
        values=AT_LEAST_0,
    )
    beam_alpha: float = setting(
        0.6,
        "The length penalty (GNMT alpha) of this run's beam search when translate, eval or"
        " serve is given no --alpha.",
        values=AT_LEAST_0,
    )
    seed: int = setting(1234, "Random seed.", values=Range(0, MAX_SEED))
    precision: str = setting(
        "auto",
        "fp32, bf16 (autocast) or auto (bf16 where the hardware is fast at it).",
        values=OneOf(PRECISIONS),
    )
    device: str = setting(
        "auto", "auto (CUDA > MPS > CPU), cpu, cuda or mps.", values=OneOf(DEVICES)
    )
    compile: str = setting(
        "auto",
        "torch.compile the forward pass and loss: on, off, or auto (eager: compiling was no"
        " faster, on CPU or CUDA: docs/speed.md).",
        values=OneOf(MODES),
    )
    scheduled_sampling: str = setting(
        "off",
        "Scheduled sampling: off, linear, exp or inverse-sigmoid.",
        values=OneOf(SCHEDULES),
        metavar="SCHEDULE",
    )
    ss_k: float | None = setting(
        None,
        "Schedule constant: linear 1-k*i, exp k^i, inverse-sigmoid k/(k+e^(i/k)).",
        values=Range(),
    )
    ss_min: float = setting(0.0, "Floor of the linear schedule.", values=Range(0, 1))
    ss_warmup: int = setting(0, "Updates of pure teacher forcing first.", values=AT_LEAST_0)
    ss_mix: str = setting(
        "argmax", "Model tokens by argmax or sample.", values=OneOf(("argmax", "sample"))
    )
    ss_tau: float = setting(1.0, "Sampling temperature.", values=Range(0, low_open=True))

    def __post_init__(self) -> None:
        super().__post_init__()
        for src, tgt in (("src_file", "tgt_file"), ("valid_src_file", "valid_tgt_file")):
            if (getattr(self, src) is None) != (getattr(self, tgt) is None):
                given, missing = (src, tgt) if getattr(self, tgt) is None else (tgt, src)
                raise SettingError(given, getattr(self, given), f"goes with {{{missing}}}")
        if self.average == 1:
            raise SettingError("average", 1, "must be 0 (off) or at least 2 checkpoints")
        if self.decay in ("linear", "cosine") and not (self.max_minutes or self.max_steps):
            raise SettingError("decay", self.decay, "needs {max_minutes} or {max_steps}")
        domain = SS_K.get(self.scheduled_sampling)
        if self.ss_k is not None and domain and (rule := domain.refuses(self.ss_k)):
            schedule = self.scheduled_sampling
            raise SettingError("ss_k", self.ss_k, f"{rule} for {{scheduled_sampling}} {schedule}")

    @property
    def budget_decay(self) -> str | None:
        """How the learning rate falls to 0 at the end of the budget (``linear``, ``cosine``),
        or None for the paper's 1/sqrt decay that never ends."""
        if self.decay == "auto":
            return "linear" if self.max_minutes else None
        return None if self.decay == "rsqrt" else self.decay


@dataclass(frozen=True)
class TrainOption:
    """A train option, declared by the metadata of the config fields (of ``table``) it sets."""

    name: str
    kind: Any
    default: Any
    help: str
    values: Range | OneOf | None
    metavar: str
    table: str
    fields: tuple[str, ...]


def train_options() -> dict[str, TrainOption]:
    """Every option of ``tformer train`` that sets config fields, by its name with ``_``, in the
    order of the fields (``layers`` sets ``n_encoder_layers`` and ``n_decoder_layers``)."""
    found: dict[str, TrainOption] = {}
    for table, cls in (("model", ModelConfig), ("train", TrainConfig)):
        hints = get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if "option" not in f.metadata:
                continue
            name = f.metadata["option"] or f.name
            if name in found:  # a second field of the same option
                known = found[name]
                found[name] = dataclasses.replace(known, fields=(*known.fields, f.name))
                continue
            kind = type(f.default) if f.default is not None else hints[f.name]
            if f.metadata["path"]:
                kind = Path | None
            meta = f.metadata
            found[name] = TrainOption(
                name,
                kind,
                f.default,
                meta["help"],
                meta["values"],
                meta["metavar"],
                table,
                (f.name,),
            )
    return found


TRAIN_OPTIONS = train_options()


def option_of(field: str) -> str:
    """The train option (its name with ``_``) that sets the config field ``field``
    (``n_encoder_layers``: ``layers``); the field's own name where none does."""
    return next((o.name for o in TRAIN_OPTIONS.values() if field in o.fields), field)


RECIPES = Path(__file__).parent.parent / "recipes"


def shipped_recipes() -> list[str]:
    """The names ``--preset`` takes besides a .toml file: the recipes shipped in the package."""
    return sorted(p.stem for p in RECIPES.glob("*.toml"))


def load_recipe(spec: str) -> dict[str, dict[str, Any]]:
    """A training recipe: ``toy``, ``multi30k`` (shipped) or a TOML file with ``[model]`` and
    ``[train]`` tables whose keys are ``ModelConfig`` / ``TrainConfig`` field names."""
    path = Path(spec) if spec.endswith(".toml") else RECIPES / f"{spec}.toml"
    if spec.endswith(".toml") and not path.is_file():
        raise TformerError(f"recipe file {spec} does not exist")
    if not path.is_file():
        shipped = ", ".join(shipped_recipes())
        raise TformerError(f"no recipe {spec!r}: use one of {shipped}, or a .toml file")
    try:
        recipe = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TformerError(f"{path}: not valid TOML ({e})") from None
    unknown = sorted(set(recipe) - {"model", "train"})
    if unknown:
        raise TformerError(f"{path}: unknown tables {', '.join(unknown)} (use [model], [train])")
    for table, cls in (("model", ModelConfig), ("train", TrainConfig)):
        names = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(recipe.get(table, {})) - names)
        if bad:
            raise TformerError(f"{path}: unknown [{table}] settings {', '.join(bad)}")
    try:  # check the values here, so that an error names the file
        from_dict(ModelConfig, {"vocab_size": 1, **recipe.get("model", {})})
        from_dict(TrainConfig, recipe.get("train", {}))
    except TformerError as e:
        raise TformerError(f"{path}: {e}") from None
    return recipe
