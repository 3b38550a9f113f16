"""Frozen configuration dataclasses, serialised to the run's ``config.json``: the model's shape
(``model``), training (``train``: its options and recipes) and decoding (``decode``); the settings
a user gives each job (``decode``, ``jobs``), declared once for every face; and the values each
field may hold (``Range``, ``OneOf``, ``Pattern``)."""

from tformer_cli.config.decode import (
    MAX_BEAM,
    MAX_HYPOTHESES,
    MAX_LENGTH,
    MAX_SEED,
    DecodeConfig,
    DecodeOptions,
    SamplingConfig,
    TraceOptions,
)
from tformer_cli.config.fields import MODES, OneOf, Pattern, Range, Values, from_dict, option
from tformer_cli.config.jobs import (
    NOT_EVALUATED,
    AttentionOptions,
    DistillOptions,
    EvalOptions,
    Limits,
    ServeOptions,
)
from tformer_cli.config.model import ACTIVATIONS, Activation, ModelConfig, Norm, Positional
from tformer_cli.config.train import (
    DECAYS,
    DEVICES,
    MAX_VOCAB,
    PRECISIONS,
    RECIPES,
    TOKENIZERS,
    TRAIN_OPTIONS,
    TrainConfig,
    TrainOption,
    load_recipe,
    option_of,
    train_options,
)

__all__ = [
    "ACTIVATIONS",
    "DECAYS",
    "DEVICES",
    "MAX_BEAM",
    "MAX_HYPOTHESES",
    "MAX_LENGTH",
    "MAX_SEED",
    "MAX_VOCAB",
    "MODES",
    "NOT_EVALUATED",
    "PRECISIONS",
    "RECIPES",
    "TOKENIZERS",
    "TRAIN_OPTIONS",
    "Activation",
    "AttentionOptions",
    "DecodeConfig",
    "DecodeOptions",
    "DistillOptions",
    "EvalOptions",
    "Limits",
    "ModelConfig",
    "Norm",
    "OneOf",
    "Pattern",
    "Positional",
    "Range",
    "SamplingConfig",
    "ServeOptions",
    "TraceOptions",
    "TrainConfig",
    "TrainOption",
    "Values",
    "from_dict",
    "load_recipe",
    "option",
    "option_of",
    "train_options",
]
