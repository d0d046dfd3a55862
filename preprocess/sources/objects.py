"""Objects in a bucket as image-text sources read them: found (``stat_object``,
``list_objects``), read by ranges (``read_range``, ``RangedFile``: a seekable file over ranged
GETs, so a tar's headers or a parquet footer are read without fetching the object), and checked
against the ETag the scan saw (``ObjectChanged``). ``bucket_resolver`` resolves a list's or a
parquet row's relative names beside the object that names them.
"""

from __future__ import annotations

import io
import os
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from tilefeed.preprocess.sources.scanning import SourceOptions
from tilefeed.store.errors import SourceError
from tilefeed.store.storage import OBJECT_SCHEMES, is_url

if TYPE_CHECKING:
    from tilefeed.store.object_storage import ObjectStorage

# one client per bucket and process, made anew when the cloud's configuration in the environment
# changes (a library caller that points the run at another endpoint or account)
_CLIENTS: dict[tuple[str, tuple[tuple[str, str], ...]], ObjectStorage] = {}
_CONFIG_PREFIXES: Final = ("AWS_", "GOOGLE_", "AZURE_")
URL: Final = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")  # any scheme's: a name that is not a path


@dataclass(frozen=True)
class BucketObject:
    """An object as the scan found it: its URL, its size in bytes and its ETag (None where the
    store gives none)."""

    url: str
    size: int
    etag: str | None = None


class ObjectChanged(ValueError):
    """An object no longer has the ETag the scan read it with: it was replaced since."""


def bucket_url(url: str, where: str = "SRC") -> str:
    """``url`` as a bucket source may name one: an object store's, with a bucket and without
    credentials (those come from the cloud's standard configuration, never from a URL).

    Raises
    ------
    SourceError
        Another scheme, no bucket, or a user or password in the URL (which the message leaves out).
    """
    scheme, _, rest = url.partition("://")
    netloc = rest.split("/", 1)[0]
    if "@" in netloc:  # first: no other message may show them
        raise SourceError(f"{where}: the URL carries credentials (user@ or user:password@): remove them; "
                          "buckets are read with the cloud's standard configuration")
    if not is_url(url):
        raise SourceError(f"{where} {url!r}: {scheme}:// is not an object store "
                          f"({', '.join(s + '://' for s in OBJECT_SCHEMES)})")
    if not netloc:
        raise SourceError(f"{where} {url!r} names no bucket")
    return url


def bucket_client(url: str) -> tuple[ObjectStorage, str]:
    """The client of ``url``'s bucket (one per bucket and process) and the object's key."""
    from tilefeed.store.object_storage import ObjectStorage

    parts = url.split("/", 3)
    bucket = "/".join(parts[:3])
    config = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_CONFIG_PREFIXES)))
    storage = _CLIENTS.get((bucket, config))
    if storage is None:
        for stale in [k for k in _CLIENTS if k[1] != config]:  # clients of a configuration no longer in use
            del _CLIENTS[stale]
        storage = _CLIENTS[(bucket, config)] = ObjectStorage(bucket)
    return storage, parts[3] if len(parts) > 3 else ""


def stat_object(url: str) -> BucketObject:
    """The object at ``url``, its size and ETag read with one HEAD.

    Raises
    ------
    FileNotFoundError
        No such object.
    StoreAccessError
        The store refused or kept failing the request (one line, without credentials).
    """
    import obstore

    storage, key = bucket_client(url)
    meta = storage._call("reading", key, lambda: obstore.head(storage.store, key))
    return BucketObject(url, int(meta["size"]), meta.get("e_tag"))


def list_objects(prefix: str) -> tuple[list[BucketObject], list[str]]:
    """The objects directly under the prefix URL ``prefix``, sorted, and the names of the
    prefixes under it (its "folders"), hidden ones left out of both: one listing, not recursive.

    Raises
    ------
    StoreAccessError
        The store refused or kept failing the listing.
    """
    import obstore

    storage, key = bucket_client(prefix)
    key = key.strip("/")
    found = storage._call("listing", key, lambda: obstore.list_with_delimiter(storage.store, key or None))
    root = "/".join(prefix.split("/", 3)[:3])
    objects = [BucketObject(f"{root}/{m['path']}", int(m["size"]), m.get("e_tag")) for m in found["objects"]
               if not posixpath.basename(m["path"]).startswith(".")]
    folders = [p.rstrip("/").rsplit("/", 1)[-1] for p in found["common_prefixes"]]
    return sorted(objects, key=lambda o: o.url), sorted(f for f in folders if not f.startswith("."))


def read_range(obj: BucketObject, start: int, end: int) -> bytes:
    """Bytes [start, end) of ``obj`` (fewer where it ends sooner) in one ranged GET, on the
    condition that its ETag is still the one the scan read.

    Raises
    ------
    ObjectChanged
        The object was replaced since ``obj`` was read.
    FileNotFoundError, StoreAccessError
        As ``stat_object``.
    """
    import obstore

    if end <= start:
        return b""
    storage, key = bucket_client(obj.url)
    options: dict[str, Any] = {"range": (start, end)}
    if obj.etag:
        options["if_match"] = obj.etag

    def get() -> bytes | None:
        try:
            return bytes(obstore.get(storage.store, key, options=options).bytes())  # type: ignore[arg-type]
        except Exception as e:
            if type(e).__name__ == "PreconditionError":  # answered at once: no retry can help
                return None
            raise

    data = storage._call("reading", key, get)
    if data is None:
        raise ObjectChanged(f"{obj.url} changed since the scan read it (its ETag is not the same): "
                            "preprocess again")
    return data


class RangedFile(io.RawIOBase):
    """An object in a bucket as a read-only, seekable file for ``tarfile`` and pyarrow, never
    held whole: a small read past what is held is one ranged GET of the read and the
    ``read_ahead`` bytes after it, kept until a read falls outside them (``tarfile`` reads the
    byte before a header, then the header); a read of ``read_ahead`` or more is fetched as asked
    and not kept. ``fetched`` counts the bytes requested.

    Parameters
    ----------
    obj : BucketObject
        The object, as the scan found it (its ETag is the condition of every read).
    read_ahead : int
        The bytes a small read fetches beyond itself; twice this is the most held between reads.
    """

    def __init__(self, obj: BucketObject, read_ahead: int) -> None:
        super().__init__()
        self.obj, self.read_ahead = obj, read_ahead
        self.fetched = 0
        self._pos = 0
        self._start, self._held = 0, b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence not in (io.SEEK_SET, io.SEEK_CUR, io.SEEK_END):
            raise ValueError(f"invalid whence ({whence})")
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.obj.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def pread(self, offset: int, count: int) -> bytes:
        """Up to ``count`` bytes at ``offset`` (fewer at the object's end); the position stays."""
        if offset < 0:
            raise ValueError(f"negative read position {offset}")
        end = min(offset + max(count, 0), self.obj.size)
        if end <= offset:
            return b""
        if self._start <= offset and end <= self._start + len(self._held):
            return self._held[offset - self._start : end - self._start]
        if end - offset >= self.read_ahead:
            self.fetched += end - offset
            return read_range(self.obj, offset, end)
        stop = min(end + self.read_ahead, self.obj.size)
        self._start, self._held = offset, b""  # the last window goes before the next arrives
        self._held = read_range(self.obj, offset, stop)
        self.fetched += stop - offset
        return self._held[: end - offset]

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            size = max(self.obj.size - self._pos, 0)
        data = self.pread(self._pos, size)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)


def bucket_resolver(listing: str, options: SourceOptions) -> Callable[[int, str], str]:
    """A bucket file's rule for the paths it names (a shard list's lines, a parquet file's path
    rows): (line or row, the path as written) -> the object's URL, or the SourceError naming
    ``listing`` and the line that refuses it. A relative path is a key beside ``listing``, held
    inside its prefix unless ``--allow-outside`` (and inside its bucket always); a URL must be
    inside that prefix too or in a bucket ``--allow-bucket`` names, as a manifest's rows are:
    another bucket would be read with this machine's cloud credentials."""
    parts = listing.split("/", 3)
    root = "/".join(parts[:3])
    folder = "/" + posixpath.dirname(parts[3] if len(parts) > 3 else "")
    inside = folder.rstrip("/") + "/"

    def resolve(line: int, path: str) -> str:
        where = f"{listing}:{line}"
        if "\0" in path:
            raise SourceError(f"{where}: the path holds a NUL")
        if URL.match(path):
            bucket_url(path, f"{where}: URL")
            if not path.startswith(root + inside) and not options.bucket_allowed(path):
                bucket = "/".join(path.split("/", 3)[:3])
                raise SourceError(f"{where}: {path!r} is in {bucket}, outside {listing}'s prefix, and would "
                                  "be read with this machine's cloud credentials; pass --allow-bucket "
                                  f"{bucket} to read it (or --allow-bucket '*' for any bucket)")
            return path
        joined = "/" + posixpath.normpath(posixpath.join(folder, path)).lstrip("/")
        if not joined.startswith(inside) and not options.allow_outside:
            raise SourceError(f"{where}: path {path!r} is outside the prefix {root + inside!r}; pass "
                              "--allow-outside to read objects elsewhere in its bucket")
        return root + joined

    return resolve
