"""From a trained model to output text, in layers: ``reference`` (what a search computes, as
naive loops), ``search`` (greedy, beam and sampling over the KV-cached ``step``, which ``fast``
runs compiled or as graphs), ``translate`` (length-sorted batches, MBR), ``streams`` (lines in,
output formats out)."""
