"""Frozen configuration dataclasses, serialised to the run's ``config.json``: the model's shape
(``model``), training (``train``: its options and recipes) and decoding (``decode``); and the
values each field may hold (``Range``, ``OneOf``)."""

from tformer_cli.config.decode import MAX_SEED, DecodeConfig, SamplingConfig
from tformer_cli.config.fields import MODES, OneOf, Range, Values, from_dict, option
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
    "MAX_SEED",
    "MAX_VOCAB",
    "MODES",
    "PRECISIONS",
    "RECIPES",
    "TOKENIZERS",
    "TRAIN_OPTIONS",
    "Activation",
    "DecodeConfig",
    "ModelConfig",
    "Norm",
    "OneOf",
    "Positional",
    "Range",
    "SamplingConfig",
    "TrainConfig",
    "TrainOption",
    "Values",
    "from_dict",
    "load_recipe",
    "option",
    "option_of",
    "train_options",
]
