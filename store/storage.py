"""Where a store lives: a local folder or an object-store URL, behind one small interface.

The writer, ``info``, ``verify`` and the reader's shard cache speak to a ``Storage`` with keys
relative to the store root ('/'-separated, as zarr's). ``LocalStorage`` writes under a temporary
name and renames; ``ObjectStorage`` (obstore: one client for S3, GCS and Azure, the one
zarr-python's ``ObjectStore`` wraps) puts each object whole, which object stores make atomic.

Credentials and endpoints come from each cloud's standard configuration (environment variables
such as ``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``AWS_PROFILE``); ``storage_options`` add to
or override them. Neither ever appears in a message: errors name the URL (bucket and prefix) and
the object key only.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import urlsplit

from tilefeed.store.atomic import atomic_file
from tilefeed.store.errors import ConfigError, CorruptChunkError, StoreAccessError, StoreWriteError

OBJECT_SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss")
# storage_options keys that configure the HTTP client or the retries rather than the cloud
CLIENT_KEYS = ("allow_http", "timeout", "connect_timeout", "pool_idle_timeout", "user_agent",
               "allow_invalid_certificates", "proxy_url")
RETRY_KEYS = ("max_retries", "retry_timeout")
# what a server says when no retry can help; an error carrying one is shown by that name
REFUSALS = ("NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch")
ATTEMPTS = 5  # whole operations, over obstore's own retries: a truncated body, a reset mid-stream
PUT_CHUNK = 16 << 20  # objects above this go up in parts (several connections)
DOWNLOAD_CHUNK = 1 << 20  # streamed downloads are written in pieces of at least this

T = TypeVar("T")
_CLIENT_PID: int | None = None  # the process whose obstore client threads are running
_SOURCES: dict[str, ObjectStorage] = {}  # read_object's clients, by bucket URL


def is_url(location: str | os.PathLike[str]) -> bool:
    """True for an object-store URL (s3://, gs://, az://); plain paths and file:// are local."""
    return isinstance(location, str) and urlsplit(location).scheme in OBJECT_SCHEMES


def local_path(location: str | os.PathLike[str]) -> Path:
    text = os.fspath(location)
    return Path(urlsplit(text).path if text.startswith("file://") else text)


def open_storage(location: str | os.PathLike[str], options: dict[str, Any] | None = None) -> Storage:
    """The storage at ``location``: an object-store URL or a local folder (path or file://)."""
    if is_url(location):
        return ObjectStorage(str(location), options)
    if options:
        raise ConfigError("storage options apply to object-store URLs, not to the folder "
                          f"{os.fspath(location)!r}")
    return LocalStorage(local_path(location))


def client_started() -> bool:
    """True once this process has run an object-store client: fork() is no longer safe."""
    return _CLIENT_PID == os.getpid()


def read_object(url: str) -> bytes:
    """The object at ``url`` (a source image in a bucket), through one client per bucket and
    process, configured the standard way."""
    bucket = "/".join(url.split("/", 3)[:3])
    storage = _SOURCES.get(bucket)
    if storage is None:
        storage = _SOURCES[bucket] = ObjectStorage(bucket)
    return storage.read(url[len(bucket) + 1 :])


def parse_options(pairs: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings (``--storage-option``) as a dict."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--storage-option takes KEY=VALUE, got {pair.split('=')[0]!r}...")
        options[key.strip().lower()] = value
    return options


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


class ObjectStorage(Storage):
    """A bucket and prefix through obstore. Picklable: the client is made anew in each process."""

    def __init__(self, url: str, options: dict[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.name = self.url
        self.options = dict(options or {})
        self._store: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_store": None}

    @property
    def store(self) -> Any:
        global _CLIENT_PID
        if _CLIENT_PID is not None and _CLIENT_PID != os.getpid():
            # obstore's I/O threads do not survive fork(): a forked child would hang, not fail
            raise StoreAccessError(
                f"{self.url}: this process was forked from one that had used object storage, and "
                "obstore cannot work after fork(); start worker processes with 'spawn' or "
                "'forkserver' (DataLoader(multiprocessing_context='forkserver'))")
        if self._store is None:
            self._store = _make_store(self.url, self.options)
            _CLIENT_PID = os.getpid()
        return self._store

    def _failed(self, what: str, key: str, e: BaseException) -> StoreAccessError:
        """One line, with no credential of the URL, the options or the environment in it."""
        return StoreAccessError(redact(f"{what} {self.where(key)} failed: {_one_line(e)}", self.options))

    def _call(self, what: str, key: str, fn: Callable[[], T]) -> T:
        """``fn`` retried with backoff on transient failures (obstore retries 5xx and resets
        itself; this also covers a body cut short); permanent ones become one-line errors."""
        for attempt in range(ATTEMPTS):
            try:
                return fn()
            except FileNotFoundError as e:
                if "NoSuchBucket" in str(e):  # not an absent object: nothing here can be read
                    raise self._failed(what, key, e) from None
                raise
            except Exception as e:  # noqa: BLE001 - classified below; nothing passes silently
                if _permanent(e) or attempt == ATTEMPTS - 1:
                    raise self._failed(what, key, e) from None
                time.sleep(min(4.0, 0.1 * 2**attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")

    def read(self, key: str) -> bytes:
        import obstore

        return self._call("reading", key, lambda: bytes(obstore.get(self.store, key).bytes()))

    def download(self, key: str, dest: Path) -> int:
        """The whole object into the file ``dest``, streamed (no copy of it in memory); its size."""
        import obstore

        def get() -> int:
            with open(dest, "wb") as f:
                for piece in obstore.get(self.store, key).stream(min_chunk_size=DOWNLOAD_CHUNK):
                    f.write(piece)
                return f.tell()

        return self._call("reading", key, get)

    def sha256(self, key: str) -> str:
        import obstore

        def get() -> str:
            h = hashlib.sha256()  # afresh on each attempt: a retry reads the object from its start
            for piece in obstore.get(self.store, key).stream(min_chunk_size=DOWNLOAD_CHUNK):
                h.update(piece)
            return h.hexdigest()

        return self._call("reading", key, get)

    def read_ranges(self, key: str, starts: Sequence[int], ends: Sequence[int]) -> list[bytes]:
        import obstore

        def get() -> list[bytes]:
            parts = obstore.get_ranges(self.store, key, starts=list(starts), ends=list(ends))
            out = [bytes(p) for p in parts]
            if [len(p) for p in out] != [e - s for s, e in zip(starts, ends, strict=True)]:
                raise ConnectionError("a range came back short")
            return out

        return self._call("reading", key, get)

    @contextmanager
    def writer(self, key: str, *, sync: bool = False) -> Iterator[IO[bytes]]:
        import obstore

        with tempfile.TemporaryFile(prefix="tilefeed-put-") as f:
            yield f

            def put() -> None:
                f.seek(0)
                obstore.put(self.store, key, f, chunk_size=PUT_CHUNK)

            self._call("writing", key, put)

    def sizes(self, prefix: str = "") -> dict[str, int]:
        import obstore

        def listing() -> dict[str, int]:
            found = {}
            for batch in obstore.list(self.store, prefix or None):
                for meta in batch:
                    found[meta["path"]] = int(meta["size"])
            return found

        return self._call("listing", prefix, listing)

    def top_level(self) -> list[str]:
        import obstore

        found = self._call("listing", "", lambda: obstore.list_with_delimiter(self.store))
        names = [p.rstrip("/") for p in found["common_prefixes"]]
        return sorted(names + [m["path"] for m in found["objects"]])

    def remove(self, name: str) -> None:
        self.delete(list(self.sizes(name)))

    def delete(self, keys: Sequence[str]) -> None:
        import obstore

        for k in range(0, len(keys), 1000):
            batch = list(keys[k : k + 1000])
            self._call("deleting", batch[0], lambda b=batch: obstore.delete(self.store, b))  # type: ignore[misc]

    def concat(self, key: str, pieces: Sequence[tuple[str, int, int]], tail: bytes, *,
               sync: bool = False) -> int:
        with self.writer(key) as out:
            for source, offset, count in pieces:
                out.write(self.read_ranges(source, [offset], [offset + count])[0])
            out.write(tail)
            return out.tell()


def _make_store(url: str, options: dict[str, Any]) -> Any:
    try:
        from obstore.store import from_url
    except ImportError:
        raise ConfigError("object-store URLs need obstore: pip install obstore") from None
    config = {k: v for k, v in options.items() if k not in (*CLIENT_KEYS, *RETRY_KEYS, "profile")}
    client: dict[str, Any] = {k: v for k, v in options.items() if k in CLIENT_KEYS}
    endpoint = str(config.get("endpoint") or config.get("endpoint_url")
                   or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT") or "")
    if endpoint.startswith("http://"):
        client.setdefault("allow_http", True)  # a plain-http endpoint (MinIO, a local server) was asked for
    for key in ("allow_http", "allow_invalid_certificates"):
        if isinstance(client.get(key), str):
            client[key] = client[key].lower() in ("1", "true", "yes")
    retry: dict[str, Any] = {}
    if "max_retries" in options:
        retry["max_retries"] = int(options["max_retries"])
    if "retry_timeout" in options:
        retry["retry_timeout"] = timedelta(seconds=float(options["retry_timeout"]))
    kwargs: dict[str, Any] = {}
    profile = options.get("profile") or os.environ.get("AWS_PROFILE")
    scheme = urlsplit(url).scheme
    if profile and scheme in ("s3", "s3a") and "access_key_id" not in config:
        kwargs["credential_provider"] = _profile_credentials(str(profile))
    try:
        return from_url(url, config=config or None, client_options=client or None,  # type: ignore[arg-type]
                        retry_config=retry or None, **kwargs)  # type: ignore[arg-type]
    except Exception as e:  # noqa: BLE001 - a bad URL or option is the user's to fix
        raise ConfigError(f"cannot use {url}: {_one_line(e)}") from None


def _profile_credentials(profile: str) -> Any:
    """Credentials of a named AWS profile (``~/.aws/config``), which obstore reads through boto3."""
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        raise ConfigError(f"the AWS profile {profile!r} is read through boto3: pip install boto3") from None
    return Boto3CredentialProvider(boto3.Session(profile_name=profile))


def _permanent(e: Exception) -> bool:
    """Errors that another attempt cannot fix: no such bucket, refused credentials, a bad option."""
    text = str(e)
    return type(e).__name__ in ("PermissionDeniedError", "UnauthenticatedError",
                                "UnknownConfigurationKeyError", "InvalidPathError",
                                "NotSupportedError") or any(
        code in text for code in (*REFUSALS, "status code: 403"))


def _one_line(e: BaseException) -> str:
    """The first line of an error, short, with any query string (a presigned URL) cut off."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    for code in REFUSALS:
        if code in str(e):
            text = f"{code} ({text.split(' - ')[0]})"
    cut = text.find("?")
    return (text[:cut] if cut >= 0 else text)[:300]


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
