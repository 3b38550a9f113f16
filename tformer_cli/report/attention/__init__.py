"""Attention inspection: ``maps`` collects, ``align`` scores, ``render`` draws, ``view`` selects."""
