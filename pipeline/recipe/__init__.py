"""Training recipes: the operations of today's recipes (per sample in the graph, per batch after
it), their settings, and the training scripts' flags turned into them."""
