"""Several stores mixed by weight: the ``Mix`` a user writes and the plan of each epoch."""
