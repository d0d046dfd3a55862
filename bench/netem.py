"""Object storage on this machine, for tests and benchmarks: a real S3 server and a proxy that
makes it behave like a far one.

``local_s3()`` runs moto's S3 server (the one zarr-python's own tests use) in a process of its
own on 127.0.0.1. ``Proxy`` stands between a client and any HTTP/1.1 server: it adds a delay to
every request, caps each connection's download rate, and injects faults on chosen requests
(a 500, a connection reset, a body cut short, a stalled connection).
"""

from __future__ import annotations

import io
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

FAULTS = ("500", "reset", "truncate", "stall")
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "tilefeed-local", "AWS_SECRET_ACCESS_KEY": "tilefeed-local-secret",
               "AWS_REGION": "us-east-1"}


def s3_options(endpoint: str) -> dict[str, str]:
    """storage_options for the local server at ``endpoint``, without touching the environment."""
    return {"endpoint": endpoint, "access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"], "region": CREDENTIALS["AWS_REGION"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the S3 server exited with status {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the S3 server did not listen on port {port} within {timeout:.0f} s")


@contextmanager
def local_s3(buckets: tuple[str, ...] = ("tilefeed",)) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 with ``buckets`` made; yields its endpoint URL.

    Sets nothing in this process's environment: callers pass the endpoint and ``CREDENTIALS``.
    """
    try:
        import moto  # noqa: F401
    except ImportError:
        raise RuntimeError("a local S3 server needs moto: pip install 'moto[server]'") from None
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from moto.server import main; main()", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **CREDENTIALS})
    try:
        _wait_for(port, proc)
        endpoint = f"http://127.0.0.1:{port}"
        for bucket in buckets:
            _create_bucket(endpoint, bucket)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _create_bucket(endpoint: str, bucket: str) -> None:
    """A PUT on the bucket: moto accepts it unsigned, so no S3 client library is needed here."""
    host, port = endpoint.rsplit("/", 1)[-1].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"PUT /{bucket} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: 0\r\n\r\n".encode())
        status = s.recv(4096).split(b"\r\n", 1)[0]
    if b" 200 " not in status + b" ":
        raise RuntimeError(f"creating bucket {bucket!r} failed: {status.decode(errors='replace')}")


@dataclass
class ProxyStats:
    requests: int = 0
    faults: int = 0
    connections: int = 0
    log: list[tuple[str, str, bool]] = field(default_factory=list)  # method, path, ranged

    def whole_gets(self, suffix: str = "") -> Counter[str]:
        """Paths fetched by whole-object GETs (no Range header), counted."""
        return Counter(path for method, path, ranged in self.log
                       if method == "GET" and not ranged and path.endswith(suffix))


class Proxy:
    """An HTTP/1.1 proxy on 127.0.0.1 in front of ``upstream`` ("host:port").

    ``latency`` seconds are added before each request is forwarded; ``rate`` bytes/s caps each
    connection's responses; ``fault(n)`` (n counts requests from 1) returns one of ``FAULTS``
    or None for request n. ``stall`` seconds is how long a stalled connection hangs.
    """

    def __init__(self, upstream: str, *, latency: float = 0.0, rate: float | None = None,
                 fault: Callable[[int], str | None] | None = None, stall: float = 30.0) -> None:
        host, port = upstream.replace("http://", "").split(":")
        self.upstream = (host, int(port))
        self.latency, self.rate, self.fault, self.stall = latency, rate, fault, stall
        self.stats = ProxyStats()
        self._count = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def close(self) -> None:
        self._closed = True
        self._server.close()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self.stats.connections += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        reader = client.makefile("rb")
        try:
            while True:
                head = _read_head(reader)
                if head is None:
                    return
                body = reader.read(_content_length(head))
                method, path = head.split(b" ", 2)[:2]
                with self._count:
                    self.stats.requests += 1
                    n = self.stats.requests
                    self.stats.log.append((method.decode(), path.decode().split("?")[0],
                                           _header(head, b"range") is not None))
                fault = self.fault(n) if self.fault else None
                if fault:
                    self.stats.faults += 1
                if self.latency:
                    time.sleep(self.latency)
                if fault == "500":
                    client.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 21\r\n"
                                   b"Connection: close\r\n\r\nInjected server error")
                    return
                if fault == "reset":
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                if fault == "stall":
                    time.sleep(self.stall)
                    return
                if upstream is None:
                    upstream = socket.create_connection(self.upstream, timeout=120)
                    up_reader = upstream.makefile("rb")
                upstream.sendall(head + body)
                response = _read_head(up_reader)
                if response is None:
                    return
                status = int(response.split(b" ", 2)[1])
                bodiless = method == b"HEAD" or status in (204, 304)
                chunked = (_header(response, b"transfer-encoding") or b"").lower() == b"chunked"
                if fault == "truncate" or chunked:
                    data = b"" if bodiless else _read_body(up_reader, response)
                    if fault == "truncate" and data:
                        client.sendall(response + data[: len(data) // 2])
                        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        return
                    self._relay(io.BytesIO(data), client, response, len(data))
                else:
                    self._relay(up_reader, client, response, 0 if bodiless else _content_length(response))
        except OSError:
            return
        finally:
            client.close()
            if upstream is not None:
                upstream.close()

    def _relay(self, source: Any, client: socket.socket, head: bytes, length: int) -> None:
        """Forward a response as it arrives, 256 KiB at a time (2.6 ms at 100 MB/s), paced to ``rate``."""
        client.sendall(head)
        start, sent = time.monotonic(), 0
        while sent < length:
            piece = source.read(min(256 << 10, length - sent))
            if not piece:
                raise ConnectionError("the server closed the connection mid-body")
            client.sendall(piece)
            sent += len(piece)
            if self.rate is not None:
                ahead = sent / self.rate - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)


def _read_head(reader: object) -> bytes | None:
    lines = []
    while True:
        line = reader.readline()  # type: ignore[attr-defined]
        if not line:
            return None
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)


def _header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def _content_length(head: bytes) -> int:
    value = _header(head, b"content-length")
    return int(value) if value else 0


def _read_body(reader: object, head: bytes) -> bytes:
    """A response body as sent (chunked bodies kept chunked)."""
    if (_header(head, b"transfer-encoding") or b"").lower() == b"chunked":
        parts = []
        while True:
            size_line = reader.readline()  # type: ignore[attr-defined]
            parts.append(size_line)
            size = int(size_line.split(b";")[0], 16)
            parts.append(reader.read(size + 2))  # type: ignore[attr-defined]
            if size == 0:
                return b"".join(parts)
    return reader.read(_content_length(head))  # type: ignore[attr-defined]


@contextmanager
def proxy_process(upstream: str, *, latency: float, rate: float | None) -> Iterator[str]:
    """A ``Proxy`` in a process of its own (so its threads do not compete with the measured
    loader for this one's interpreter); yields its endpoint URL."""
    args = [sys.executable, "-m", "tilefeed.bench.netem", upstream, "--latency", str(latency)]
    if rate is not None:
        args += ["--rate", str(rate)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m tilefeed.bench.netem",
                                description="Serve a delaying, rate-capping HTTP proxy until killed; "
                                "prints its port first.")
    p.add_argument("upstream", help="HOST:PORT of the server behind it")
    p.add_argument("--latency", type=float, default=0.0, help="seconds added to every request")
    p.add_argument("--rate", type=float, default=None, help="bytes/s per connection")
    args = p.parse_args()
    proxy = Proxy(args.upstream, latency=args.latency, rate=args.rate)
    print(proxy.port, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
