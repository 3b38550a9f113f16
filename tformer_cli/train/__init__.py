"""Training: the loop (``trainer``), the label-smoothed loss and scheduled sampling."""
