"""The output's rules: OUT kept apart from SRC, one writer at a time, a store replaced only by
its own kind, and only what tilefeed wrote removed; for a folder and for a bucket prefix alike."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tilefeed.store import format as fmt
from tilefeed.store.atomic import open_lock_file
from tilefeed.store.documents import parse_attrs
from tilefeed.store.errors import SourceError, StoreAccessError, StoreExistsError, StoreWriteError
from tilefeed.store.storage import Storage

PLAN_FILE = "plan.json"
PID_FIELD = 24  # bytes of the lock file that hold the writer's pid


@dataclass(frozen=True)
class RunPlan:
    """A run's identity (``writer._plan``), as the work folder's plan.json records it.

    Attributes
    ----------
    fingerprint : str
        sha256 in hex of the settings, the classes and every source's path, label and size: a
        store or a partial run with another fingerprint is another store.
    sources : int
        The sources the scan listed.
    settings : dict
        The settings as the attributes' ``made`` records them (``settings.describe``).
    """

    fingerprint: str
    sources: int
    settings: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """The JSON object plan.json holds, its keys in this order."""
        return asdict(self)


def out_inside(src: Path, out: Path) -> Path | None:
    """OUT's resolved path when it lies inside the SRC folder (the scan must skip it), else None."""
    if not src.is_dir():
        return None
    src_abs, out_abs = src.resolve(), out.resolve()
    if out_abs == src_abs:
        raise SourceError(f"OUT {str(out)!r} is SRC itself; write the store to another folder")
    if src_abs in out_abs.parents:
        return out_abs
    return None


@contextmanager
def writer_lock(out: Storage) -> Iterator[None]:
    """One writer per store at a time: an advisory lock the kernel drops if the writer dies.

    A bucket has no such lock: one writer per prefix is the caller's to keep (tasks are
    idempotent and objects appear whole, so a second writer of the same plan does no harm).
    """
    root = out.local
    if root is None:
        yield
        return
    lock_path = root.parent / f".{root.name}.tilefeed-lock"
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        fd = open_lock_file(lock_path, 0o644)
    except OSError as e:
        raise StoreWriteError(f"cannot write to OUT {str(root)!r}: {e.strerror or e}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, PID_FIELD, 0).decode(errors="replace").strip() or "another process"
            raise StoreExistsError(
                f"OUT {str(root)!r} is being written right now by `tilefeed preprocess` (pid "
                f"{holder}); wait for it to finish, then rerun to use the store; do not start a "
                "second writer on the same OUT"
            ) from None
        # a fixed-width field, so that a shorter pid needs no truncation to read back whole
        os.pwrite(fd, f"{os.getpid():<{PID_FIELD - 1}}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays, empty of meaning, for the next writer


@contextmanager
def scan_folder(out: Storage) -> Iterator[Path]:
    """An empty folder for the scan of SRC (the source list, sorted runs), removed at the end.

    Beside a local OUT (``.OUT.tilefeed-scan``, on OUT's disk, where the user chose to put the
    store's bytes, rather than in a temporary folder that may be memory): entered only under
    the writer's lock, so what a killed run left there is removed first. For a bucket store, a
    temporary folder.
    """
    root = out.local
    if root is None:
        with tempfile.TemporaryDirectory(prefix="tilefeed-scan-") as scratch:
            yield Path(scratch)
        return
    folder = root.parent / f".{root.name}.tilefeed-scan"
    _remove_entry(folder)
    try:
        os.mkdir(folder, 0o700)  # never follows a link planted at the name: it fails instead
    except OSError as e:
        raise StoreWriteError(f"cannot write beside OUT {str(root)!r}: {e.strerror or e}") from None
    try:
        yield folder
    finally:
        _remove_entry(folder)


def _remove_entry(path: Path) -> None:
    """Remove ``path``: a real folder with its contents, anything else (a link) as itself."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def prepare_output(out: Storage, plan: RunPlan, overwrite: bool, notes: list[str]) -> bool:
    """Make ``out`` ready for this plan; True when it already holds this very store, complete."""
    root = out.name
    if out.local is not None and out.local.exists() and not out.local.is_dir():
        raise StoreExistsError(f"OUT {root!r} is a file; give a folder path")
    plan_key = f"{fmt.WORK_DIR}/{PLAN_FILE}"
    if out.top_level():
        attrs = _read_json(out, "zarr.json", parse_attrs)
        pending = _read_json(out, plan_key, json.loads)
        if attrs is None and pending is None:
            raise StoreExistsError(
                f"OUT {root!r} is not empty and holds no tilefeed store; choose a new or "
                "empty folder (--overwrite only replaces tilefeed stores)"
            )
        ours = (attrs or pending or {}).get("fingerprint") == plan.fingerprint
        if ours and attrs is not None:
            out.remove(fmt.WORK_DIR)  # a crash after the last write left it
            return True
        if not ours:
            if not overwrite:
                raise StoreExistsError(
                    f"OUT {root!r} holds a {'complete' if attrs else 'partial'} tilefeed store "
                    "made from other sources or settings; pass --overwrite to replace it"
                )
            left = remove_store(out)
            if left:
                notes.append(f"--overwrite removed the old store and left {len(left)} entries it did "
                             f"not write: {', '.join(left[:5])}{', ...' if len(left) > 5 else ''}")
    try:
        out.write(plan_key, json.dumps(plan.as_dict()).encode())
    except OSError as e:
        raise StoreWriteError(f"cannot write to OUT {root!r}: {e.strerror or e}") from None
    return False


def _read_json(out: Storage, key: str, parse: Any) -> Any:
    """``parse(bytes)`` of ``key``, or None when it is absent or unreadable as JSON."""
    try:
        return parse(out.read(key))
    except StoreAccessError:
        raise  # the bucket refused: not the same as an absent file
    except (OSError, ValueError):
        return None


def remove_store(out: Storage) -> list[str]:
    """Remove what a tilefeed writer makes; returns the names of the other entries, left alone."""
    left = []
    for name in out.top_level():
        if not fmt.written(name):
            left.append(name)
        else:
            out.remove(name)
    return left
