"""tformer: a small, fast, readable Transformer toolkit for neural machine translation."""

__version__ = "0.1.0"
