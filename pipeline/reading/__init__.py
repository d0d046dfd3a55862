"""Reading stores on the host: one store (``StoreReader``), several as one (``MixedReader``),
and a torch ``TileDataset`` over a store."""
