"""Frozen configuration dataclasses, serialised to the run's ``config.json``: the model's shape
(``model``), training (``train``: its options and recipes) and decoding (``decode``)."""

from tformer_cli.config.decode import DecodeConfig, SamplingConfig
from tformer_cli.config.fields import from_dict, option
from tformer_cli.config.model import ACTIVATIONS, Activation, ModelConfig, Norm, Positional
from tformer_cli.config.train import (
    DECAYS,
    MAX_SEED,
    MAX_VOCAB,
    RECIPES,
    TRAIN_OPTIONS,
    TrainConfig,
    TrainOption,
    load_recipe,
    train_options,
)

__all__ = [
    "ACTIVATIONS",
    "DECAYS",
    "MAX_SEED",
    "MAX_VOCAB",
    "RECIPES",
    "TRAIN_OPTIONS",
    "Activation",
    "DecodeConfig",
    "ModelConfig",
    "Norm",
    "Positional",
    "SamplingConfig",
    "TrainConfig",
    "TrainOption",
    "from_dict",
    "load_recipe",
    "option",
    "train_options",
]
