"""Every error tilefeed raises on purpose.

Each also subclasses the builtin a caller would naturally catch, so ``except ValueError`` and
``except OSError`` keep working; messages name the parameter or file and say what to do, in one
line (``one_line`` gives the reason a library's exception carries).
"""

from __future__ import annotations

import re
from typing import Final


class TilefeedError(Exception):
    """Base of all tilefeed errors."""


class ConfigError(TilefeedError, ValueError):
    """An option has a value tilefeed cannot use."""


class ConfigAttributeError(ConfigError, AttributeError):
    """An attribute that means nothing for this configuration (a Loader over a ``Mix`` has no
    single ``dataset``). Also an ``AttributeError``, so ``hasattr`` and ``getattr(obj, name,
    default)`` answer as for any object without it, and the message says why."""


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
    """A shard index or chunk failed its crc32c check or does not decode.

    Parameters
    ----------
    shard : str
        The damaged file: a shard, an array chunk or a metadata document.
    sample : int or None
        The sample whose tile is damaged, when one is.
    detail : str
        What failed, in one line.
    """

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


# what an object store answers when no retry can help; a message carrying one is shown by that name
REFUSALS: Final = ("NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch")


# a URL's query string: a presigned URL carries credentials there
_QUERY: Final = re.compile(r"([a-z][a-z0-9+.-]*://[^\s?]*)\?\S*", re.IGNORECASE)


def one_line(e: BaseException) -> str:
    """The reason an exception gives, for a one-line message (a reject's reason, a decode
    error): all its lines joined with runs of spaces closed up, any URL's query string cut off."""
    text = " ".join(str(e).split()) or type(e).__name__
    return _QUERY.sub(r"\1", text)[:300]


def refusal(e: BaseException) -> str:
    """What an object store's client error says, in one line: its first line (the rest is the
    client's debug detail), a refusal no retry can help shown by its code, any query cut off."""
    lines = str(e).strip().splitlines()
    text = " ".join(lines[0].split()) if lines else type(e).__name__
    for code in REFUSALS:
        if code in str(e):
            text = f"{code} ({text.split(' - ')[0]})"
            break
    return _QUERY.sub(r"\1", text)[:300]


def unfinished_store(where: str) -> StoreFormatError:
    """A store whose writer has not finished (its work folder is there, its attributes not yet)."""
    return StoreFormatError(f"store {where!r} is incomplete: preprocessing did not finish; rerun the same "
                            "`tilefeed preprocess` command to resume it")
