"""What each epoch holds and in which order: the epoch order per rank, and the output size
schedule."""
