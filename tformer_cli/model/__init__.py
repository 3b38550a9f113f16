"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017)."""

from tformer_cli.model.transformer import DecoderCache, Transformer

__all__ = ["DecoderCache", "Transformer"]
