"""Training: the update and the loop (``trainer``), what surrounds the loop (``bookkeeping``), its
schedule (``schedule``, ``budget``), what a run saves (``state``), how a run is set up
(``setup``), the label-smoothed loss, scheduled sampling and DDP."""
