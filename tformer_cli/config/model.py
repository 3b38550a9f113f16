"""The model's shape (section 3 of the paper, table 3's names), serialised to the run's
``config.json``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from tformer_cli.config.fields import Checked, OneOf, Range, setting, values
from tformer_cli.errors import SettingError

Positional = Literal["sinusoidal", "learned"]
Norm = Literal["post", "pre"]
Activation = Literal["relu", "silu"]
SIZE = Range(1)  # widths, heads, layers


@dataclass(frozen=True)
class ModelConfig(Checked):
    """Shape of the encoder-decoder Transformer (names from "Attention Is All You Need")."""

    vocab_size: int
    d_model: int = setting(128, "Model width d_model.", values=SIZE)
    h: int = setting(4, "Attention heads h.", "heads", values=SIZE)
    d_ff: int = setting(512, "Inner width of the feed-forward layers.", values=SIZE)
    n_encoder_layers: int = setting(2, "Encoder and decoder layers (each).", "layers", values=SIZE)
    # the same option as n_encoder_layers: --layers sets both stacks
    n_decoder_layers: int = field(default=2, metadata={"option": "layers", **values(SIZE)})
    dropout: float = setting(
        0.2, "Dropout on embeddings and sublayers.", values=Range(0, 1, high_open=True)
    )
    positional: Positional = setting(
        "sinusoidal", "sinusoidal or learned.", values=OneOf(get_args(Positional))
    )
    norm: Norm = setting(
        "post", "post: LayerNorm(x + f(x)) (paper), or pre.", values=OneOf(get_args(Norm))
    )
    tie_embeddings: bool = setting(True, "Tie embeddings and output layer.", "tie")
    max_positions: int = 1024
    # of the FFN: the paper's ReLU, or SiLU (Marian's swish)
    activation: Activation = field(default="relu", metadata=values(OneOf(get_args(Activation))))
    output_bias: bool = False  # a bias on the output layer's logits (Marian's final_logits_bias)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.d_model % self.h:
            raise SettingError("h", self.h, f"must divide {{d_model}} ({self.d_model})")

    @property
    def d_k(self) -> int:
        return self.d_model // self.h
