"""Makers of hostile inputs, and the CLI run as a user runs it with its memory peak measured."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Runs ``tilefeed ARGS`` and, on the way out, writes the peak resident memory (KiB) of this
# process and of the largest of its children it waited for (the worker processes). Its own peak
# is VmHWM, its address space's since exec: Linux carries ru_maxrss across exec, so that figure
# would be at least the test process's resident size when it started the command.
_MEASURED = """
import atexit, os, resource, sys

def _hwm():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

def _peaks():
    with open(os.environ["TILEFEED_TEST_PEAKS"], "w") as f:
        f.write(f"{_hwm()} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}")

atexit.register(_peaks)
sys.argv = ["tilefeed", *sys.argv[1:]]
from tilefeed.cli.main import main
sys.exit(main())
"""


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    driver_mib: float  # peak resident memory of the command's own process
    worker_mib: float  # the largest peak among the child processes it waited for

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def refused(self, *expected: str) -> str:
        """The one line of a refusal: exit status 1, one line on stderr, no traceback."""
        assert self.returncode == 1, self.output
        assert "Traceback" not in self.output, self.output
        lines = self.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tilefeed: error: "), self.stderr
        for text in expected:
            assert text in lines[0], lines[0]
        return lines[0]


def run_measured(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
                 timeout: float = 120) -> Run:
    """``tilefeed ARGS`` in a new process, as a user runs it, with its memory peaks."""
    with tempfile.TemporaryDirectory(prefix="tilefeed-peaks-") as scratch:
        peaks = Path(scratch) / "peaks"
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", _MEASURED, *args], capture_output=True, text=True,
                              timeout=timeout, cwd=cwd,
                              env={**os.environ, **(env or {}), "TILEFEED_TEST_PEAKS": str(peaks)})
        seconds = time.perf_counter() - start
        own, children = (int(v) / 1024 for v in peaks.read_text().split())
    return Run(done.returncode, done.stdout, done.stderr, seconds, own, children)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def write_grey_png(path: Path, width: int, height: int, depth: int) -> Path:
    """A greyscale PNG (8 or 16 bits) of a left-to-right ramp, written row block by row block,
    so that making a picture of 13000 x 13000 takes a few MB here and a few hundred KB on disk."""
    top = 65535 if depth == 16 else 255
    ramp = np.linspace(0, top, width).astype(">u2" if depth == 16 else "u1").tobytes()
    line = b"\0" + ramp  # filter type 0 (none)
    block = line * 64
    pack = zlib.compressobj(9)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, 0, 0, 0, 0)))
        body = [pack.compress(block if y + 64 <= height else line * (height - y))
                for y in range(0, height, 64)]
        body.append(pack.flush())
        f.write(_chunk(b"IDAT", b"".join(body)))
        f.write(_chunk(b"IEND", b""))
    return path


def snapshot(*paths: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``paths`` (links not followed) with its mtime and bytes: what a test
    compares to show nothing outside the store or cache was touched."""
    found = {}
    for root in paths:
        entries = [root] if root.is_file() or root.is_symlink() else sorted(root.rglob("*"))
        for p in entries:
            if p.is_symlink():
                found[str(p)] = (0, os.readlink(p).encode())
            elif p.is_file():
                found[str(p)] = (p.stat().st_mtime_ns, p.read_bytes())
    return found


class _Repeated:
    """A file-like of ``size`` bytes of one value, read in blocks: a member of any size written
    into a tar without holding it."""

    def __init__(self, size: int, byte: bytes = b"a") -> None:
        self.left, self.byte = size, byte

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return self.byte * n


def tar_member(tar: tarfile.TarFile, name: str, data: bytes | None = None, *, size: int = 0,
               kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
    """A member of ``tar`` as given, name untouched: ``data``, or ``size`` bytes of 'a', or a
    link, device or fifo entry (``kind``, ``link``)."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    if kind == tarfile.REGTYPE:
        info.size = len(data) if data is not None else size
        tar.addfile(info, io.BytesIO(data) if data is not None else _Repeated(size))  # type: ignore[arg-type]
    else:
        tar.addfile(info)


def write_hostile_tar(path: Path, image: bytes) -> dict[str, str]:
    """A tar shard of two good samples (``good0``, ``good1``) and a sample each of every hostile
    member; returns the reject expected of each (listed path -> a part of its reason)."""
    hostile = {
        "../evil.jpg": "climbs out with '..'",
        "/abs/evil.jpg": "absolute member name",
        "link.jpg": "symbolic link",
        "hard.jpg": "hard link",
        "fifo.jpg": "device or fifo",
        "badutf.jpg": "caption 'caption' is not valid UTF-8",
        "nul.jpg": "holds a NUL",
        "huge.jpg": f"caption 'caption' is {100 << 20} bytes, over the 32768",
        "deep.jpg": "metadata nested too deeply",
        "bigjson.jpg": f"metadata too large: bigjson.json is {2 << 20} bytes",
    }
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for k in range(2):
            tar_member(tar, f"good{k}.jpg", image)
            tar_member(tar, f"good{k}.txt", f"good caption {k}".encode())
        tar_member(tar, "../evil.jpg", image)
        tar_member(tar, "../evil.txt", b"evil")
        tar_member(tar, "/abs/evil.jpg", image)
        tar_member(tar, "/abs/evil.txt", b"evil")
        tar_member(tar, "link.jpg", kind=tarfile.SYMTYPE, link="/etc/passwd")
        tar_member(tar, "link.txt", b"a link")
        tar_member(tar, "hard.jpg", kind=tarfile.LNKTYPE, link="good0.jpg")
        tar_member(tar, "hard.txt", b"a hard link")
        tar_member(tar, "fifo.jpg", kind=tarfile.FIFOTYPE)
        tar_member(tar, "fifo.txt", b"a fifo")
        for name, caption in (("badutf", b"caf\xe9 \xff"), ("nul", b"a\0b")):
            tar_member(tar, f"{name}.jpg", image)
            tar_member(tar, f"{name}.txt", caption)
        tar_member(tar, "huge.jpg", image)
        tar_member(tar, "huge.txt", size=100 << 20)
        for name, meta in (("deep", b"[" * 500_000), ("bigjson", b'{"a": "' + b"b" * ((2 << 20) - 9) + b'"}')):
            tar_member(tar, f"{name}.jpg", image)
            tar_member(tar, f"{name}.txt", b"a caption")
            tar_member(tar, f"{name}.json", meta)
    return {f"{path}#{name}": reason for name, reason in hostile.items()}


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def parquet_declaring_rows(path: Path, rows: int) -> Path:
    """A parquet file of 777 rows whose footer declares ``rows``: FileMetaData's num_rows (thrift
    compact field 3, an i64 right after the schema) rewritten, the footer's length with it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    held = 777
    pq.write_table(pa.table({"image": [b"x"] * held, "caption": ["c"] * held}), path)
    data = path.read_bytes()
    size = int.from_bytes(data[-8:-4], "little")
    footer = data[-8 - size : -8]
    old, new = b"\x16" + _varint(held << 1), b"\x16" + _varint(rows << 1)  # zigzag, of counts >= 0
    assert old in footer
    footer = footer.replace(old, new, 1)  # the first: the file's, before its row groups'
    path.write_bytes(data[: -8 - size] + footer + len(footer).to_bytes(4, "little") + b"PAR1")
    return path
