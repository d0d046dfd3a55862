"""Training recipes on the device: what is done to a batch after the graph."""
