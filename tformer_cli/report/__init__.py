"""Measuring a trained model: BLEU/chrF and teacher-forced metrics, the exposure-bias report,
and the attention maps."""
