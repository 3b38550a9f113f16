"""The model's shape (section 3 of the paper, table 3's names), serialised to the run's
``config.json``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tformer_cli.config.fields import option
from tformer_cli.errors import TformerError

Positional = Literal["sinusoidal", "learned"]
Norm = Literal["post", "pre"]
Activation = Literal["relu", "silu"]
ACTIVATIONS = ("relu", "silu")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the encoder-decoder Transformer (names from "Attention Is All You Need")."""

    vocab_size: int
    d_model: int = field(default=128, metadata=option("Model width d_model."))
    h: int = field(default=4, metadata=option("Attention heads h.", "heads"))
    d_ff: int = field(default=512, metadata=option("Inner width of the feed-forward layers."))
    n_encoder_layers: int = field(
        default=2, metadata=option("Encoder and decoder layers (each).", "layers")
    )
    # the same option as n_encoder_layers: --layers sets both stacks
    n_decoder_layers: int = field(default=2, metadata={"option": "layers"})
    dropout: float = field(default=0.2, metadata=option("Dropout on embeddings and sublayers."))
    positional: Positional = field(default="sinusoidal", metadata=option("sinusoidal or learned."))
    norm: Norm = field(
        default="post", metadata=option("post: LayerNorm(x + f(x)) (paper), or pre.")
    )
    tie_embeddings: bool = field(
        default=True, metadata=option("Tie embeddings and output layer.", "tie")
    )
    max_positions: int = 1024
    activation: Activation = "relu"  # of the FFN: the paper's ReLU, or SiLU (Marian's swish)
    output_bias: bool = False  # a bias on the output layer's logits (Marian's final_logits_bias)

    def __post_init__(self) -> None:
        sizes = {"d_model": "--d-model", "h": "--heads", "d_ff": "--d-ff",
                 "n_encoder_layers": "--layers", "n_decoder_layers": "--layers"}  # fmt: skip
        for name, flag in sizes.items():
            if getattr(self, name) < 1:
                value = getattr(self, name)
                raise TformerError(f"{name} ({flag}) must be at least 1, not {value}")
        if self.d_model % self.h:
            raise TformerError(f"d_model ({self.d_model}) must be divisible by h ({self.h})")
        if not 0 <= self.dropout < 1:
            raise TformerError(f"dropout must be in [0, 1), not {self.dropout}")
        if self.activation not in ACTIVATIONS:
            raise TformerError(f"unknown activation {self.activation!r}: use relu or silu")

    @property
    def d_k(self) -> int:
        return self.d_model // self.h
