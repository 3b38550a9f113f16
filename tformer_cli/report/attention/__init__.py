"""Attention inspection, in the order data flows: ``maps`` (collect the weights; the types every
view shares) -> ``align`` (score heads against gold alignments) and ``render`` (terminal, SVG,
HTML, PNG, JSON) -> ``view`` (select what to show; the ``inspect-attention`` command)."""
