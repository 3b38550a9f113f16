"""Measuring a trained model: BLEU/chrF, exposure bias, attention maps, runs and curves."""
