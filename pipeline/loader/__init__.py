"""The Loader: its face (DataLoader's options, a DataLoader-like face for scripts), the state of
its epochs, and resume."""
