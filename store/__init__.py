"""The store contract both sides stand on: the format (names, layout, checksums, typed
attributes), the codecs and their zarr declarations, storage backends and the shard cache,
atomic writes, the errors, inspection and the host's facts. It imports nothing of tilefeed's
above it (``make check`` holds the order)."""

from __future__ import annotations

if __name__ != "tilefeed.store":  # the repository's folder imported as itself, from a checkout's root
    raise ImportError(f"import tilefeed.store, not {__name__}: the same module under two names would be "
                      "two modules (two graph pools, two caches)")
