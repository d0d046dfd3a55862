"""Where a store lives: a local folder or an object-store URL, behind one small interface.

The writer, ``info``, ``verify`` and the reader's shard cache speak to a ``Storage`` with keys
relative to the store root ('/'-separated, as zarr's). ``LocalStorage`` writes under a temporary
name and renames; ``ObjectStorage`` (``object_storage``) puts each object whole, which object
stores make atomic; ``storage_at`` (``location``) chooses between them. No message shows a
credential: ``redact`` cuts them out of any text.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from tilefeed.store.atomic import atomic_file
from tilefeed.store.errors import CorruptChunkError, StoreWriteError

OBJECT_SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss")
DOWNLOAD_CHUNK = 1 << 20  # streamed downloads are written in pieces of at least this


def is_url(location: str | os.PathLike[str]) -> bool:
    """True for an object-store URL (s3://, gs://, az://); plain paths and file:// are local."""
    return isinstance(location, str) and urlsplit(location).scheme in OBJECT_SCHEMES


def local_path(location: str | os.PathLike[str]) -> Path:
    text = os.fspath(location)
    return Path(urlsplit(text).path if text.startswith("file://") else text)


class Storage:
    """Keys under one root. ``local`` is the root folder for local storage, None for a bucket."""

    name: str  # what messages show: the folder or the URL, never a credential
    local: Path | None = None

    def read(self, key: str) -> bytes:
        """The whole object; FileNotFoundError when it is absent."""
        raise NotImplementedError

    def read_ranges(self, key: str, starts: Sequence[int], ends: Sequence[int]) -> list[bytes]:
        raise NotImplementedError

    def sha256(self, key: str) -> str:
        """sha256 (hex) of the whole object, read as it is stored now (streamed, never held whole)."""
        raise NotImplementedError

    def write(self, key: str, data: bytes, *, sync: bool = False) -> None:
        with self.writer(key, sync=sync) as f:
            f.write(data)

    @contextmanager
    def writer(self, key: str, *, sync: bool = False) -> Iterator[IO[bytes]]:
        """A file to fill; it appears at ``key`` whole when the block ends without an error."""
        raise NotImplementedError
        yield

    def sizes(self, prefix: str = "") -> dict[str, int]:
        """Every object under ``prefix`` (recursively) with its size in bytes."""
        raise NotImplementedError

    def top_level(self) -> list[str]:
        """The names directly under the root (files and folders)."""
        raise NotImplementedError

    def remove(self, name: str) -> None:
        """Remove ``name`` and everything under it."""
        raise NotImplementedError

    def delete(self, keys: Sequence[str]) -> None:
        raise NotImplementedError

    def concat(self, key: str, pieces: Sequence[tuple[str, int, int]], tail: bytes, *,
               sync: bool = False) -> int:
        """Write ``key`` as the byte runs (source key, offset, count) then ``tail``; its size."""
        raise NotImplementedError

    def upload_tree(self, folder: Path, last: str) -> None:
        """Every file under ``folder`` to the same keys here, ``last`` after all the others."""
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        files.sort(key=lambda p: p.relative_to(folder).as_posix() == last)
        for path in files:
            key = path.relative_to(folder).as_posix()
            with self.writer(key) as f, open(path, "rb") as src:
                shutil.copyfileobj(src, f, 1 << 20)

    def where(self, key: str) -> str:
        """``key`` as a message names it."""
        return f"{self.name.rstrip('/')}/{key}"


class LocalStorage(Storage):
    def __init__(self, root: Path) -> None:
        self.local = self.root = root
        self.name = str(root)

    def read(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def read_ranges(self, key: str, starts: Sequence[int], ends: Sequence[int]) -> list[bytes]:
        with open(self.root / key, "rb") as f:
            return [os.pread(f.fileno(), end - start, start) for start, end in zip(starts, ends, strict=True)]

    def sha256(self, key: str) -> str:
        h = hashlib.sha256()
        with open(self.root / key, "rb") as f:
            while block := f.read(DOWNLOAD_CHUNK):
                h.update(block)
        return h.hexdigest()

    @contextmanager
    def writer(self, key: str, *, sync: bool = False) -> Iterator[IO[bytes]]:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path, sync=sync) as f:
            yield f

    def sizes(self, prefix: str = "") -> dict[str, int]:
        base = self.root / prefix if prefix else self.root
        if base.is_file():
            return {prefix: base.stat().st_size}
        if not base.is_dir():
            return {}
        return {p.relative_to(self.root).as_posix(): p.stat().st_size
                for p in base.rglob("*") if p.is_file() and not p.is_symlink()}

    def top_level(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir()) if self.root.is_dir() else []

    def remove(self, name: str) -> None:
        entry = self.root / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink(missing_ok=True)

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            (self.root / key).unlink(missing_ok=True)

    def concat(self, key: str, pieces: Sequence[tuple[str, int, int]], tail: bytes, *,
               sync: bool = False) -> int:
        with self.writer(key, sync=sync) as out:
            for source, offset, count in pieces:
                with open(self.root / source, "rb") as src:
                    _copy_range(src, out, offset, count)
            out.write(tail)
            return out.tell()


def _copy_range(src: Any, dst: Any, offset: int, count: int) -> None:
    """One in-kernel copy (copy_file_range) where the filesystem has it."""
    dst.flush()
    while count:
        try:
            n = os.copy_file_range(src.fileno(), dst.fileno(), count, offset)
        except OSError:  # a filesystem or kernel without it
            src.seek(offset)
            dst.write(src.read(count))
            dst.flush()
            return
        if n == 0:
            raise StoreWriteError(f"{src.name} is shorter than its record says")
        offset += n
        count -= n


# -- messages without credentials ---------------------------------------------------------------
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@")
_SECRET_WORDS = frozenset(("SECRET", "TOKEN", "PASSWORD", "PASSWD", "PASS", "KEY", "CREDENTIAL",
                           "CREDENTIALS", "SAS", "SIGNATURE", "AUTH", "AUTHORIZATION"))


def _secrets(options: Mapping[str, Any] | None) -> set[str]:
    """Values that must never be shown: those of secret-looking environment variables and
    storage options, and the user and password of any URL among the options."""
    found = set()
    named = [*os.environ.items(), *((str(k), v) for k, v in (options or {}).items())]
    for name, value in named:
        if not isinstance(value, str):
            continue
        words = set(re.split(r"[^A-Z0-9]+", name.upper()))
        if words & _SECRET_WORDS and len(value) >= 6:
            found.add(value)
        if "://" in value:
            try:
                parts = urlsplit(value)
                found.update(p for p in (parts.username, parts.password) if p and len(p) >= 3)
            except ValueError:
                continue
    return found


def redact(text: str, options: Mapping[str, Any] | None = None) -> str:
    """``text`` with credentials cut out: the user and password of any URL, and the values of
    secret-looking environment variables and storage ``options``."""
    text = _USERINFO.sub(r"\1***@", text)
    for secret in sorted(_secrets(options), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def redacted(error: BaseException, options: Mapping[str, Any] | None = None) -> BaseException:
    """``error`` with every text argument passed through ``redact`` (its type kept)."""
    error.args = tuple(redact(a, options) if isinstance(a, str) else a for a in error.args)
    if isinstance(error, CorruptChunkError):
        error.shard, error.detail = redact(error.shard, options), redact(error.detail, options)
    return error
