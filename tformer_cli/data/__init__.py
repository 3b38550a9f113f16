"""Text in, token ids out: corpora (toy, local files, Hugging Face datasets), the subword
tokenizer, the tokenized-data cache and token-budget batches. Knows nothing of the model."""
