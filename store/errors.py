"""Every error tilefeed raises on purpose.

Each also subclasses the builtin a caller would naturally catch, so ``except ValueError`` and
``except OSError`` keep working; messages name the parameter or file and say what to do.
"""

from __future__ import annotations


class TilefeedError(Exception):
    """Base of all tilefeed errors."""


class ConfigError(TilefeedError, ValueError):
    """An option has a value tilefeed cannot use."""


class SourceError(TilefeedError, ValueError):
    """The image source (folder tree or manifest) is missing, empty or malformed."""


class StoreExistsError(TilefeedError, FileExistsError):
    """The output folder already holds something that is not this run's store."""


class StoreFormatError(TilefeedError, ValueError):
    """A folder is not a complete tilefeed store of a version this code reads."""


class StoreWriteError(TilefeedError, OSError):
    """Writing the store failed (disk full, permissions); the partial store can be resumed."""


class StoreAccessError(TilefeedError, OSError):
    """Object storage refused or kept failing a request (missing bucket, credentials, network)."""


class CorruptChunkError(TilefeedError, OSError):
    """A shard index or chunk failed its crc32c check or does not decode."""

    def __init__(self, shard: str, sample: int | None, detail: str) -> None:
        # ``shard`` is the damaged file (a shard, an array chunk or a metadata document)
        where = f"sample {sample}: " if sample is not None else ""
        super().__init__(f"{shard}: {where}{detail}")
        self.shard = shard
        self.sample = sample
        self.detail = detail


class DaliMissingError(TilefeedError, ImportError):
    """NVIDIA DALI, which the Loader runs on, is not installed."""


class CacheError(TilefeedError, OSError):
    """The local cache folder holds something tilefeed will not use (a symbolic link, a file
    where a folder belongs); the message names it."""


class TileDecodeError(CorruptChunkError, ValueError):
    """A chunk decodes to other than exactly its tile's bytes (short, oversized, another picture
    size); also a ValueError, as a decoder's own complaint would be."""


class LedgerError(TilefeedError, ValueError):
    """A ledger file (``Loader(ledger=DIR)``) is damaged or was not written by tilefeed."""


class UncheckedCacheWarning(UserWarning):
    """A store in object storage records no sha256 of its shards (written by an older tilefeed):
    the copies of its shards in the cache folder cannot be checked against the bucket."""
