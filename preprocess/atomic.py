"""One way to write a file that a reader sees whole or not at all: temporary name, then rename."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def temporary_name(path: Path) -> Path:
    """The name ``path`` is filled under, beside it, unique to this process and thread."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")


@contextmanager
def atomic_file(path: Path, *, sync: bool = False) -> Iterator[BinaryIO]:
    """An open file under a temporary name in ``path``'s folder, renamed to ``path`` on success.

    ``sync`` fsyncs before the rename: for files that must outlive the machine (shards on a
    cluster). Work files need only outlive the process (kill -9, a crash) and skip it. A failure
    leaves the temporary file, which the next run overwrites or the writer sweeps.
    """
    tmp = temporary_name(path)
    with open(tmp, "wb") as f:
        yield f
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write(path: Path, data: bytes) -> None:
    with atomic_file(path) as f:
        f.write(data)
