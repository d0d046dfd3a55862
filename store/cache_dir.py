"""The local cache folder of bucket stores: where it lies, made private to the user, and
entered and changed without following a symbolic link. Folders are entered with ``O_NOFOLLOW``
relative to their parent, files are created afresh under temporary names and renamed, lock
files are never truncated: a link planted in the cache folder is refused or leads nowhere."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import IO

from tilefeed.store import format as fmt
from tilefeed.store.atomic import CLOEXEC, NOFOLLOW, create_new, open_lock_file, temporary_name
from tilefeed.store.errors import CacheError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW | CLOEXEC
_FILE_FLAGS = os.O_RDONLY | NOFOLLOW | CLOEXEC | getattr(os, "O_NONBLOCK", 0)  # a planted pipe never blocks
# The folders, below a store's root, that hold one entry per shard number, per sharded array
# (images, and the masks of a store with targets): what every shard's key of that array shares.
_SHARDS_FOLDERS = {array: PurePosixPath(os.path.commonpath([fmt.shard_relpath(0, array),
                                                            fmt.shard_relpath(1, array)])).parts
                   for array in (fmt.IMAGES, fmt.MASKS)}


def default_cache_dir() -> Path:
    """``$TILEFEED_CACHE``, else tilefeed's folder in the user's cache folder."""
    base = os.environ.get("TILEFEED_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tilefeed")
    return Path(base)


def make_cache_dir(path: Path) -> None:
    """The cache folder, created readable by this user only; an existing one must be this
    user's (another user could otherwise plant or swap what it holds)."""
    try:
        os.makedirs(path, 0o700, exist_ok=True)
        owner = os.stat(path).st_uid
    except FileExistsError:
        raise CacheError(f"the cache folder {str(path)!r} is a file; remove it or choose another") from None
    except OSError as e:
        raise CacheError(f"cannot make the cache folder {str(path)!r}: {e.strerror or e}") from None
    if owner != os.getuid():
        raise CacheError(f"the cache folder {str(path)!r} belongs to another user (uid {owner}); "
                         "choose a folder of your own (cache_dir=, or $TILEFEED_CACHE)")


def enter_dir(fd: int, parts: Sequence[str], create: bool, where: Path) -> int:
    """A descriptor of the folder ``parts`` below the folder ``fd`` (which stays open), each
    entered without following a link and, with ``create``, made private where absent."""
    current = fd
    try:
        for k, part in enumerate(parts):
            if part in ("", ".", "..") or "/" in part:
                raise CacheError(f"{str(where)!r}: {part!r} is no name of a cache entry")
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=current)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o700, dir_fd=current)
                except FileExistsError:
                    pass  # another process made it just now
                nxt = os.open(part, _DIR_FLAGS, dir_fd=current)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                at = where.joinpath(*parts[: k + 1])
                raise CacheError(f"{str(at)!r} in the cache is a symbolic link or a file where a "
                                 "folder belongs; tilefeed never follows one there: remove it") from None
            if current != fd:
                os.close(current)
            current = nxt
    except BaseException:
        if current != fd:
            os.close(current)
        raise
    return current if current != fd else os.dup(fd)


def open_dir(root: Path, parts: Sequence[str], *, create: bool) -> int:
    """A descriptor of ``root/parts...``; ``root`` is the folder the user named (or made
    here), everything below it is entered as ``enter_dir`` does."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | CLOEXEC)
    try:
        return enter_dir(fd, parts, create, root)
    finally:
        os.close(fd)


def unlink_at(dfd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass


def unlink_entry(root: Path, rel: str) -> None:
    """Remove the file ``root/rel`` (the entry itself, never a link's target); nothing when a
    folder on the way is absent or is a link."""
    *folders, name = rel.split("/")
    try:
        dfd = open_dir(root, folders, create=False)
    except (FileNotFoundError, CacheError):
        return
    try:
        unlink_at(dfd, name)
    finally:
        os.close(dfd)


def put_file(root: Path, rel: str, fill: Callable[[IO[bytes]], object]) -> None:
    """The file ``root/rel`` written whole by ``fill(file)``: under a temporary name created
    afresh in a folder entered without following links, then renamed."""
    *folders, name = rel.split("/")
    dfd = open_dir(root, folders, create=True)
    tmp = temporary_name(Path(name)).name
    try:
        with os.fdopen(create_new(tmp, 0o600, dir_fd=dfd), "w+b") as f:
            fill(f)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        unlink_at(dfd, tmp)
        os.close(dfd)


def open_file_at(dfd: int, name: str) -> int:
    """A descriptor of the file ``name`` in the folder ``dfd``, for reading; OSError when it is
    absent or a link, and a pipe planted there does not block the open."""
    return os.open(name, _FILE_FLAGS, dir_fd=dfd)


@contextmanager
def exclusive_lock(path: Path, root: Path | None = None) -> Iterator[None]:
    """An exclusive lock on the file ``path``, created if absent and never truncated. The
    folders from ``root`` (default: ``path``'s own folder) down to it are made private, and
    neither they nor the file may be symbolic links."""
    base = path.parent if root is None else root
    parts = path.parent.relative_to(base).parts
    if root is None:
        make_cache_dir(base)
    dfd = open_dir(base, parts, create=True)
    try:
        try:
            fd = open_lock_file(path.name, 0o600, dir_fd=dfd)
        except OSError as e:
            raise CacheError(f"cannot lock {str(path)!r}: {e.strerror or e}") from None
    finally:
        os.close(dfd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def cached_shards(cache_dir: Path) -> list[tuple[float, int, str]]:
    """(last use, size, path under the cache folder) of every shard file there: real folders and
    regular files only, so a link planted in the cache folder leads nowhere. A shard's last use
    is its access time, which ``ShardCache`` sets as it hands the shard out."""
    found: list[tuple[float, int, str]] = []
    try:
        top = os.open(cache_dir, os.O_RDONLY | os.O_DIRECTORY | CLOEXEC)
    except FileNotFoundError:
        return found
    try:
        with os.scandir(top) as mirrors:
            names = [e.name for e in mirrors if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)]
        for mirror in names:
            for array, folder in _SHARDS_FOLDERS.items():
                try:
                    shards_fd = enter_dir(top, [mirror, *folder], False, cache_dir)
                except (OSError, CacheError):
                    continue
                try:
                    found += _shard_files(shards_fd, mirror, cache_dir, array)
                finally:
                    os.close(shards_fd)
    finally:
        os.close(top)
    return found


def _shard_files(shards_fd: int, mirror: str, cache_dir: Path, array: str) -> list[tuple[float, int, str]]:
    """``cached_shards`` of one array of one store's mirror; ``shards_fd`` is its folder of
    shard numbers."""
    with os.scandir(shards_fd) as entries:
        numbers = [e.name for e in entries
                   if e.name.isascii() and e.name.isdigit() and e.is_dir(follow_symlinks=False)]
    found: list[tuple[float, int, str]] = []
    for number in numbers:
        rel = fmt.shard_relpath(int(number), array)
        first, *folders, name = rel.split("/")[len(_SHARDS_FOLDERS[array]):]
        if first != number:  # '007': not a name a shard is given
            continue
        try:
            fd = enter_dir(shards_fd, [first, *folders], False, cache_dir)
        except (OSError, CacheError):
            continue
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue
        finally:
            os.close(fd)
        if stat.S_ISREG(st.st_mode):
            found.append((st.st_atime, st.st_size, f"{mirror}/{rel}"))
    return found
