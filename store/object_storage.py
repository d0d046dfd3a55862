"""Object storage (S3, GCS, Azure) through obstore: one client for all three, the one
zarr-python's ``ObjectStore`` wraps. Each object is put whole, which object stores make atomic;
every request is retried over obstore's own retries, and one no retry can help fails at once.

Credentials and endpoints come from each cloud's standard configuration (environment variables
such as ``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``AWS_PROFILE``); ``storage_options`` add to
or override them. Neither ever appears in a message: errors name the URL (bucket and prefix) and
the object key only.
"""

from __future__ import annotations

import hashlib
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import IO, Any, TypeVar
from urllib.parse import urlsplit

from tilefeed.store.errors import REFUSALS, ConfigError, CorruptChunkError, StoreAccessError, refusal
from tilefeed.store.storage import DOWNLOAD_CHUNK, Storage, redact

# storage_options keys that configure the HTTP client or the retries rather than the cloud
CLIENT_KEYS = ("allow_http", "timeout", "connect_timeout", "pool_idle_timeout", "user_agent",
               "allow_invalid_certificates", "proxy_url")
RETRY_KEYS = ("max_retries", "retry_timeout")
ATTEMPTS = 5  # whole operations, over obstore's own retries: a truncated body, a reset mid-stream
PUT_CHUNK = 16 << 20  # objects above this go up in parts (several connections)
DOWNLOAD_THREADS = 8  # concurrent requests: enough to hide per-request latency on object stores

T = TypeVar("T")
_CLIENT_PID: int | None = None  # the process whose obstore client threads are running
_SOURCES: dict[str, ObjectStorage] = {}  # read_object's clients, by bucket URL


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
        return StoreAccessError(redact(f"{what} {self.where(key)} failed: {refusal(e)}", self.options))

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

    def download_capped(self, key: str, f: IO[bytes], cap: int) -> tuple[int, str]:
        """The object ``key`` streamed into ``f`` (emptied first), but never more than ``cap`` + 1
        bytes of it: the bytes written (``cap`` + 1 meaning the object is larger than ``cap``) and
        their sha256 (hex), taken as they stream."""
        import obstore

        def get() -> tuple[int, str]:
            f.seek(0)
            f.truncate()
            written, h = 0, hashlib.sha256()
            for piece in obstore.get(self.store, key).stream(min_chunk_size=DOWNLOAD_CHUNK):
                view = memoryview(piece)[: cap + 1 - written]
                f.write(view)
                h.update(view)
                written += len(view)
                if written > cap:
                    break  # dropping the stream closes the connection: nothing more is read
            f.flush()
            return written, h.hexdigest()

        return self._call("reading", key, get)

    def read_capped(self, key: str, cap: int) -> bytes:
        """The object ``key``, which must hold at most ``cap`` bytes, read in pieces."""
        import obstore

        def get() -> bytes:
            data = bytearray()
            for piece in obstore.get(self.store, key).stream(min_chunk_size=DOWNLOAD_CHUNK):
                data += memoryview(piece)[: cap + 1 - len(data)]
                if len(data) > cap:
                    break
            return bytes(data)

        data = self._call("reading", key, get)
        if len(data) > cap:
            raise CorruptChunkError(self.where(key), None, f"larger than {cap} bytes")
        return data

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
        raise ConfigError(f"cannot use {url}: {refusal(e)}") from None


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
