"""The loaders compared with tilefeed, built on equal terms: PIL DataLoader, DALI's file
reader, a DataLoader over tiles, FFCV."""
