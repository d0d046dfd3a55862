"""The output folder's rules: OUT kept apart from SRC, one writer at a time, a store replaced
only by its own kind, and only what tilefeed wrote removed."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tilefeed.preprocess import format as fmt
from tilefeed.preprocess.atomic import atomic_write
from tilefeed.preprocess.errors import SourceError, StoreExistsError, StoreWriteError

PLAN_FILE = "plan.json"


def out_inside(src: Path, out: Path) -> Path | None:
    """OUT's absolute path when it lies inside the SRC folder (the scan must skip it), else None."""
    if not src.is_dir():
        return None
    src_abs, out_abs = src.resolve(), out.resolve()
    if out_abs == src_abs:
        raise SourceError(f"OUT {str(out)!r} is SRC itself; write the store to another folder")
    if src_abs in out_abs.parents:
        return out.absolute()
    return None


@contextmanager
def writer_lock(root: Path) -> Iterator[None]:
    """One writer per store at a time: an advisory lock the kernel drops if the writer dies."""
    lock_path = root.parent / f".{root.name}.tilefeed-lock"
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise StoreWriteError(f"cannot write to OUT {str(root)!r}: {e.strerror or e}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            raise StoreExistsError(
                f"OUT {str(root)!r} is being written right now by `tilefeed preprocess` (pid "
                f"{holder}); wait for it to finish, then rerun to use the store; do not start a "
                "second writer on the same OUT"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays, empty of meaning, for the next writer


def prepare_output(root: Path, plan: dict[str, Any], overwrite: bool, notes: list[str]) -> bool:
    """Make ``root`` ready for this plan; True when it already holds this very store, complete."""
    if root.exists() and not root.is_dir():
        raise StoreExistsError(f"OUT {str(root)!r} is a file; give a folder path")
    work = root / fmt.WORK_DIR
    if root.is_dir() and any(root.iterdir()):
        attrs = fmt.read_attrs(root)
        try:
            pending = json.loads((work / PLAN_FILE).read_text())
        except (OSError, json.JSONDecodeError):
            pending = None
        if attrs is None and pending is None:
            raise StoreExistsError(
                f"OUT {str(root)!r} is not empty and holds no tilefeed store; choose a new or "
                "empty folder (--overwrite only replaces tilefeed stores)"
            )
        ours = (attrs or pending or {}).get("fingerprint") == plan["fingerprint"]
        if ours and attrs is not None:
            shutil.rmtree(work, ignore_errors=True)  # a crash after the last write left it
            return True
        if not ours:
            if not overwrite:
                raise StoreExistsError(
                    f"OUT {str(root)!r} holds a {'complete' if attrs else 'partial'} tilefeed store "
                    "made from other sources or settings; pass --overwrite to replace it"
                )
            left = remove_store(root)
            if left:
                notes.append(f"--overwrite removed the old store and left {len(left)} entries it did "
                             f"not write: {', '.join(left[:5])}{', ...' if len(left) > 5 else ''}")
    try:
        work.mkdir(parents=True, exist_ok=True)
        atomic_write(work / PLAN_FILE, json.dumps(plan).encode())
    except OSError as e:
        raise StoreWriteError(f"cannot write to OUT {str(root)!r}: {e.strerror or e}") from None
    return False


def remove_store(root: Path) -> list[str]:
    """Remove what a tilefeed writer makes; returns the names of the other entries, left alone."""
    left = []
    for entry in sorted(root.iterdir()):
        if entry.name not in fmt.WRITTEN:
            left.append(entry.name)
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return left
