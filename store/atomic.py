"""One way to write a file that a reader sees whole or not at all: temporary name, then rename.

Neither step follows a symbolic link: the temporary name is created afresh (``O_CREAT|O_EXCL``,
``O_NOFOLLOW``), so a link planted there is replaced, never written through, and the rename
replaces whatever entry holds the final name, a link included, rather than its target.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def temporary_name(path: Path) -> Path:
    """The name ``path`` is filled under, beside it, unique to this process and thread."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")


def create_new(path: str | Path, mode: int = 0o644, *, dir_fd: int | None = None) -> int:
    """A descriptor of a new, empty file at ``path`` (in the folder ``dir_fd``, when given),
    open for reading and writing; whatever held the name before (a file a killed writer left, a planted
    link) is removed first, never followed."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC
    try:
        return os.open(path, flags, mode, dir_fd=dir_fd)
    except FileExistsError:
        os.unlink(path, dir_fd=dir_fd)  # the entry itself: a link goes, its target stays as it was
        return os.open(path, flags, mode, dir_fd=dir_fd)


def open_lock_file(path: str | Path, mode: int = 0o600, *, dir_fd: int | None = None) -> int:
    """A descriptor of the lock file ``path`` (in the folder ``dir_fd``, when given), created if
    absent, never truncated: a lock file is only ever opened, locked and written in place.

    It must be this user's own regular file with no other name: a symbolic link or a hard link
    planted at ``path`` would make what is written into it land in another file, so either is
    refused (``OSError`` naming the path), as is anything but a regular file.
    """
    flags = os.O_RDWR | os.O_CREAT | NOFOLLOW | CLOEXEC | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags, mode, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, f"the lock file {str(path)!r} is a symbolic link; remove it "
                          "(tilefeed never writes through a link)") from None
        raise
    st = os.fstat(fd)
    problem = ("is not a regular file" if not stat.S_ISREG(st.st_mode)
               else "has other names (hard links)" if st.st_nlink != 1
               else "belongs to another user" if hasattr(os, "getuid") and st.st_uid != os.getuid()
               else "")
    if problem:
        os.close(fd)
        raise OSError(errno.EPERM, f"the lock file {str(path)!r} {problem}; remove it")
    return fd


@contextmanager
def atomic_file(path: Path, *, sync: bool = False) -> Iterator[BinaryIO]:
    """An open file under a temporary name in ``path``'s folder, renamed to ``path`` on success.

    ``sync`` fsyncs before the rename: for files that must outlive the machine (shards on a
    cluster). Work files need only outlive the process (kill -9, a crash) and skip it. A failure
    leaves the temporary file, which the next run replaces or the writer sweeps.
    """
    tmp = temporary_name(path)
    with os.fdopen(create_new(tmp), "wb") as f:
        yield f
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write(path: Path, data: bytes) -> None:
    with atomic_file(path) as f:
        f.write(data)
