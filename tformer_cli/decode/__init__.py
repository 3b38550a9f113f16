"""From a trained model to output tokens: greedy and beam search over the KV-cached decode step."""
