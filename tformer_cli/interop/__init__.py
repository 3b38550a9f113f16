"""Models that leave tformer (CTranslate2, Hugging Face Marian) and models that come in (Marian)."""
