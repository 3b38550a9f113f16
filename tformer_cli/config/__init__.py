"""Frozen configuration dataclasses, serialised to the run's ``config.json``: the model's shape
(``model``), training (``train``: its options and recipes) and decoding (``decode``); the settings
a user gives each job (``decode``, ``jobs``), declared once for every face; and the values each
field may hold (``Range``, ``OneOf``, ``Pattern``)."""

from tformer_cli.config.decode import DecodeConfig, DecodeOptions, SamplingConfig, TraceOptions
from tformer_cli.config.fields import (
    MODES,
    OneOf,
    Pattern,
    Range,
    Values,
    from_dict,
    option,
    setting,
)
from tformer_cli.config.jobs import (
    NOT_EVALUATED,
    QUANTIZATIONS,
    AttentionOptions,
    DistillOptions,
    EvalOptions,
    Limits,
    ServeOptions,
)
from tformer_cli.config.model import ModelConfig
from tformer_cli.config.train import (
    DEVICES,
    MAX_VOCAB,
    PRECISIONS,
    RECIPES,
    TRAIN_OPTIONS,
    TrainConfig,
    load_recipe,
    option_of,
    shipped_recipes,
)

__all__ = [
    "DEVICES",
    "MAX_VOCAB",
    "MODES",
    "NOT_EVALUATED",
    "PRECISIONS",
    "QUANTIZATIONS",
    "RECIPES",
    "TRAIN_OPTIONS",
    "AttentionOptions",
    "DecodeConfig",
    "DecodeOptions",
    "DistillOptions",
    "EvalOptions",
    "Limits",
    "ModelConfig",
    "OneOf",
    "Pattern",
    "Range",
    "SamplingConfig",
    "ServeOptions",
    "TraceOptions",
    "TrainConfig",
    "Values",
    "from_dict",
    "load_recipe",
    "option",
    "option_of",
    "setting",
    "shipped_recipes",
]
