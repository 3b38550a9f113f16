"""Training: the loop (``trainer``), its schedule (``schedule``), what a run saves (``state``), how
a run is set up (``setup``), the label-smoothed loss, scheduled sampling and DDP."""
