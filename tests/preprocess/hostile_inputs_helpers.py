"""Makers of hostile inputs, and the CLI run as a user runs it with its memory peak measured."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
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
