"""WebDataset tar shards (img2dataset's output): each sample a run of tar members sharing a key,
its image (``--image-key``: the first extension present, in order), its caption (``.txt``) and
its metadata (``.json``).

SRC is a brace pattern (``shards/{00000..00009}.tar``, numeric ranges padded as written, comma
lists), a folder of ``.tar`` files, one ``.tar``, or a ``.txt`` list of tar paths (one a line,
relative to the list's folder and held inside it as a manifest's rows are). Shards are read in
sorted order from this machine's files; a sample's key is its member's name up to the first dot
of the base name (its folder kept), its extension the rest, lower-cased, as WebDataset's
``base_plus_ext`` splits it.

A tar is read with ``tarfile`` in seekable mode and never extracted: each sample is listed with
its image's *member* (the tar's real path, the data's offset and size), which a worker reads
with one ``pread`` (``read_member``). Every name is untrusted: a member that is a link, a
device or a fifo, whose name is absolute or climbs out with ``..``, or is not UTF-8, rejects its
sample with the reason and is never followed. Header data (long names, pax attributes) is read
up to ``MAX_HEADER_DATA``, a ``.json`` member up to ``MAX_JSON``, a ``.txt`` caption up to what
a caption may hold; an image member over ``MAX_MEMBER`` is a reject. A truncated or corrupt tar
keeps the samples read before the damage and is itself a reject naming the error.

Beside a shard, img2dataset writes ``NAME.parquet`` with a row per sample it tried: its rows
whose ``status`` is not ``success`` become rejects with its ``error_message`` (``download failed:
...``; ``decode or resize failed: ...`` for its ``failed_to_resize``, which covers an image that
did not decode as well as one its size checks refused), when pyarrow is installed.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from tilefeed.preprocess.sources.manifest import path_resolver
from tilefeed.preprocess.sources.scanning import (PairOptions, PairSink, SampleRejected, Scan, SourceOptions,
                                                  caption_from_bytes, utf8)
from tilefeed.store import format as fmt
from tilefeed.store.errors import SourceError
from tilefeed.store.storage import is_url

MAX_SHARDS: Final = 1 << 20  # shards a pattern or a list may name
MAX_JSON: Final = 1 << 20  # a sample's .json member
MAX_HEADER_DATA: Final = 1 << 20  # one read of tar header data: a long name, pax attributes
MAX_MEMBER: Final = 1 << 30  # one image member
MAX_LIST_BYTES: Final = 64 << 20  # a .txt list of shards
_BRACE: Final = re.compile(r"\{([^{}]*)\}")
_RANGE: Final = re.compile(r"(\d+)\.\.(\d+)")
_KEY: Final = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # WebDataset's base_plus_ext
_URL: Final = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
# img2dataset's statuses of a sample not written, as a reject's reason starts
_FAILED: Final = {"failed_to_download": "download failed", "failed_to_resize": "decode or resize failed"}
NO_BUCKETS: Final = "buckets are not supported for webdataset shards yet: copy the shards to this machine"


def is_pattern(src: str) -> bool:
    """True when ``src`` holds a brace group to expand (a range or a comma list)."""
    return any(_RANGE.fullmatch(m[1]) or "," in m[1] for m in _BRACE.finditer(src))


def expand_braces(pattern: str) -> list[str]:
    """Every name ``pattern`` stands for, in order, as WebDataset's braceexpand gives them:
    ``{a..b}`` numeric ranges (zero-padded to the wider end when either is written with a
    leading zero; descending when a > b), ``{x,y}`` comma lists; other braces are text.

    Raises
    ------
    SourceError
        The pattern stands for more than ``MAX_SHARDS`` names.
    """
    found = next((m for m in _BRACE.finditer(pattern) if _RANGE.fullmatch(m[1]) or "," in m[1]), None)
    if found is None:
        return [pattern]
    body = found[1]
    ranged = _RANGE.fullmatch(body)
    if ranged:
        a, b = ranged[1], ranged[2]
        lo, hi = int(a), int(b)
        if abs(hi - lo) + 1 > MAX_SHARDS:
            raise SourceError(f"the pattern {pattern!r} names {abs(hi - lo) + 1} shards, over the {MAX_SHARDS} "
                              "a run reads")
        padded = (a.startswith("0") and len(a) > 1) or (b.startswith("0") and len(b) > 1)
        width = max(len(a), len(b)) if padded else 0
        step = 1 if hi >= lo else -1
        choices = [str(n).zfill(width) for n in range(lo, hi + step, step)]
    else:
        choices = body.split(",")
    rest = expand_braces(pattern[found.end():])
    if len(choices) * len(rest) > MAX_SHARDS:
        raise SourceError(f"the pattern {pattern!r} names more than the {MAX_SHARDS} shards a run reads")
    head = pattern[: found.start()]
    return [head + c + r for c, r in itertools.product(choices, rest)]


def shard_paths(src: str, options: SourceOptions) -> list[str]:
    """SRC's shards as absolute paths, sorted, each once (a missing one is the scan's reject).

    Raises
    ------
    SourceError
        A bucket, a pattern naming too many shards, a list file that cannot be read or names a
        URL or a path outside its folder, or no shard at all.
    """
    if is_url(src) or _URL.match(src):
        raise SourceError(f"SRC {src!r}: {NO_BUCKETS}")
    root = Path(src)
    if is_pattern(src) and not root.exists():
        found = [os.path.abspath(p) for p in expand_braces(src)]
        if not any(os.path.lexists(p) for p in found):
            raise SourceError(f"SRC {src!r}: the pattern matches no file")
    elif root.is_dir():
        found = [os.path.abspath(e.path) for e in os.scandir(root)
                 if e.name.lower().endswith(".tar") and not e.name.startswith(".") and e.is_file()]
        if not found:
            raise SourceError(f"SRC {src!r} holds no .tar files")
    elif root.suffix.lower() == ".txt":
        found = _listed_shards(root, options)
    else:
        found = [os.path.abspath(root)]
    return sorted(set(found))


def _listed_shards(listing: Path, options: SourceOptions) -> list[str]:
    """The tars a ``.txt`` list names, resolved against its folder."""
    try:
        size = listing.stat().st_size
        if size > MAX_LIST_BYTES:
            raise SourceError(f"{str(listing)!r} is {size} bytes, over the {MAX_LIST_BYTES >> 20} MiB a shard "
                              "list may hold")
        lines = listing.read_text(encoding="utf-8-sig").splitlines()
    except OSError as e:
        raise SourceError(f"cannot read {str(listing)!r}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise SourceError(f"{str(listing)!r} is not UTF-8 text") from None
    resolve = path_resolver(listing, options)
    found = []
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if _URL.match(text):
            raise SourceError(f"{listing}:{number}: {NO_BUCKETS}")
        if "\0" in text:
            raise SourceError(f"{listing}:{number}: the path holds a NUL")
        found.append(resolve(number, text)[0])
        if len(found) > MAX_SHARDS:
            raise SourceError(f"{str(listing)!r} names more than the {MAX_SHARDS} shards a run reads")
    if not found:
        raise SourceError(f"{str(listing)!r} names no shard")
    return found


def scan_webdataset(src: str, options: SourceOptions, pairs: PairOptions, out: PairSink) -> Scan:
    """Every sample of SRC's shards into ``out``, shard by shard (sorted), in tar order."""
    shards = shard_paths(src, options)
    out.notes.append(f"SRC read as webdataset shards ({len(shards)} tar{'s' if len(shards) > 1 else ''})")
    for shard in shards:
        _scan_tar(shard, pairs, out)
    return out.scan()


class _BoundedReads:
    """A tar file for ``tarfile``: any one read past ``MAX_HEADER_DATA`` (what a header that
    declares huge long-name or pax data would ask) fails instead of allocating it."""

    def __init__(self, f: io.BufferedReader) -> None:
        self.f = f

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > MAX_HEADER_DATA:
            raise tarfile.ReadError(f"a header declares {n} bytes of names or attributes, over the "
                                    f"{MAX_HEADER_DATA} read")
        return self.f.read(n)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.f.seek(offset, whence)

    def tell(self) -> int:
        return self.f.tell()


@dataclass
class _Sample:
    """The members of one key, by extension, or the first reason one of them is refused."""

    key: str
    members: dict[str, tarfile.TarInfo] = field(default_factory=dict)
    problem: tuple[str, str] | None = None  # (member name, reason)


def _unsafe(info: tarfile.TarInfo, size: int) -> str | None:
    """Why the member cannot be read as part of a sample, or None."""
    name = info.name
    if not utf8(name) or "\0" in name:
        return "member name is not valid UTF-8"
    if name.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", name):
        return "absolute member name: never followed"
    if ".." in re.split(r"[\\/]", name):
        return "member name climbs out with '..': never followed"
    if info.issym():
        return "a symbolic link member: never followed"
    if info.islnk():
        return "a hard link member: never followed"
    if info.ischr() or info.isblk() or info.isfifo():
        return "a device or fifo member: never read"
    if not info.isreg():
        return "not a regular file member"
    if info.offset_data + info.size > size:
        return "truncated: the tar ends inside this member"
    return None


def _scan_tar(shard: str, pairs: PairOptions, out: PairSink) -> None:
    """One tar's samples into ``out``; the tar itself a reject when it cannot be read whole."""
    try:
        fd = os.open(shard, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        out.reject(shard, "missing: file not found")
        return
    except OSError as e:
        out.reject(shard, f"unreadable: {e.strerror or e}")
        return
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            out.reject(shard, "not a regular file")
            return
        real = os.path.realpath(shard)
        samples = 0
        group: _Sample | None = None
        try:
            tar = tarfile.open(fileobj=_BoundedReads(f), mode="r:")  # type: ignore[call-overload]
            while (member := tar.next()) is not None:
                tar.members.clear()  # read as a stream: nothing held per member
                if member.isdir():
                    continue
                problem = _unsafe(member, info.st_size)
                found = _KEY.match(member.name)  # a refused member spoils the sample of its key
                key, ext = (found[1], found[2].lower()) if found else (member.name, "")
                if problem is None and (found is None or os.path.basename(key).startswith("__")):
                    continue  # no extension, or WebDataset's __meta__ entries: not part of a sample
                if group is None or group.key != key:
                    if group is not None:
                        samples += _sample(group, fd, shard, real, pairs, out)
                    group = _Sample(key)
                if problem is not None:
                    group.problem = group.problem or (member.name, problem)
                elif ext in group.members:
                    group.problem = group.problem or (member.name, f"a second .{ext} member in one sample")
                else:
                    group.members[ext] = member
            end = tar.offset
        except Exception as e:  # noqa: BLE001 - whatever a damaged tar raises: the tar is the reject
            if group is not None:
                samples += _sample(group, fd, shard, real, pairs, out)
            out.reject(shard, f"corrupt or truncated tar after {samples} samples (those kept): "
                              f"{type(e).__name__}: {e}")
            _failed_downloads(shard, out)
            return
        if group is not None:
            samples += _sample(group, fd, shard, real, pairs, out)
        marker = os.pread(fd, 512, end)
        if len(marker) < 512:
            out.reject(shard, f"truncated tar: it ends without its end-of-archive blocks, after {samples} "
                              "samples (those kept)")
        elif marker.count(0) != 512:
            out.reject(shard, f"corrupt tar: an unreadable header at byte {end}, after {samples} samples "
                              "(those kept)")
    _failed_downloads(shard, out)


def _read(fd: int, info: tarfile.TarInfo) -> bytes:
    return os.pread(fd, info.size, info.offset_data)


def _sample(group: _Sample, fd: int, shard: str, real: str, pairs: PairOptions, out: PairSink) -> int:
    """One key's sample into ``out`` (or its reject); 1 when it was a sample at all."""
    if group.problem is not None:
        out.reject(f"{shard}#{group.problem[0]}", group.problem[1])
        return 1
    ext = next((e for e in pairs.image_key if e in group.members), None)
    if ext is None:
        held = ", ".join(f".{e}" for e in group.members)
        out.reject(f"{shard}#{group.key}", f"no image: none of {', '.join('.' + e for e in pairs.image_key)} "
                                           f"(the sample holds {held})")
        return 1
    image = group.members[ext]
    where = f"{shard}#{image.name}"
    try:
        if image.size > MAX_MEMBER:
            raise SampleRejected(f"too large: the image member is {image.size} bytes, over the "
                                 f"{MAX_MEMBER >> 30} GiB read")
        if image.size == 0:
            raise SampleRejected("empty file (0 bytes)")
        meta: dict[str, Any] = {}
        if "json" in group.members:
            meta = _metadata(fd, group.members["json"])
        captions: dict[str, Any] = {name: meta.get(name) for name in pairs.caption_key}
        if "caption" in pairs.caption_key and "txt" in group.members:
            text = group.members["txt"]
            if text.size > 2 * fmt.MAX_TEXT_BYTES:  # stripped, it could not fit either: left unread
                raise SampleRejected(f"caption 'caption' is {text.size} bytes, over the {fmt.MAX_TEXT_BYTES} a "
                                     "caption may hold")
            caption = caption_from_bytes(_read(fd, text), "caption")
            if caption is not None:  # an empty .txt leaves the .json's caption, if any
                captions["caption"] = caption
    except SampleRejected as e:
        out.reject(where, str(e))
        return 1
    fields = dict(meta)
    fields.setdefault("key", os.path.basename(group.key))
    out.sample(where, captions, fields, {"tar": real, "offset": image.offset_data, "size": image.size})
    return 1


def _metadata(fd: int, info: tarfile.TarInfo) -> dict[str, Any]:
    """A sample's ``.json`` member: a JSON object of at most ``MAX_JSON`` bytes."""
    if info.size > MAX_JSON:
        raise SampleRejected(f"metadata too large: {os.path.basename(info.name)} is {info.size} bytes, over "
                             f"the {MAX_JSON >> 20} MiB read")
    try:
        meta = json.loads(_read(fd, info))
    except RecursionError:
        raise SampleRejected(f"metadata nested too deeply: {os.path.basename(info.name)}") from None
    except ValueError as e:
        raise SampleRejected(f"metadata not valid JSON: {os.path.basename(info.name)}: {e}") from None
    if not isinstance(meta, dict):
        raise SampleRejected(f"metadata not a JSON object: {os.path.basename(info.name)}")
    return meta


def _failed_downloads(shard: str, out: PairSink) -> None:
    """The rows of img2dataset's ``.parquet`` beside ``shard`` whose download failed, as rejects."""
    table = os.path.splitext(shard)[0] + ".parquet"
    if not os.path.isfile(table):
        return
    from tilefeed.preprocess.sources.parquet import NEEDS_PYARROW, open_checked

    try:
        pf = open_checked(Path(table), lambda schema: [n for n in ("key", "status", "error_message")
                                                       if n in schema.names])
        if "status" not in pf.schema_arrow.names or "key" not in pf.schema_arrow.names:
            return
        columns = ["key", "status"] + (["error_message"] if "error_message" in pf.schema_arrow.names else [])
        for g in range(pf.metadata.num_row_groups):
            rows = pf.read_row_group(g, columns=columns).to_pydict()
            for k, (key, status) in enumerate(zip(rows["key"], rows["status"], strict=True)):
                if status != "success":
                    error = rows.get("error_message", [None] * len(rows["key"]))[k]
                    out.reject(f"{shard}#{key}", f"{_FAILED.get(status, 'not written')}: {error or status}")
    except SourceError as e:
        if NEEDS_PYARROW in str(e):
            note = ("img2dataset's per-shard .parquet files not read (failed downloads not listed): "
                    + NEEDS_PYARROW)
        else:
            note = f"{table!r} not read: {e}"
        if note not in out.notes:
            out.notes.append(note)
    except Exception as e:  # noqa: BLE001 - a damaged side table costs its list of failures only
        out.notes.append(f"{table!r} not read: {type(e).__name__}: {e}")


def read_member(member: dict[str, Any]) -> bytes:
    """A tar member's bytes (a worker's read): one ``pread``, the tar opened without following
    a link (the scan recorded its real path) or waiting on a pipe.

    Raises
    ------
    ValueError
        A member over ``MAX_MEMBER``, a tar that is no longer a regular file, or one that ends
        before the member does.
    OSError
        The tar cannot be opened or read.
    """
    size, offset = int(member["size"]), int(member["offset"])
    if not 0 <= size <= MAX_MEMBER or offset < 0:
        raise ValueError(f"a member of {size} bytes, over the {MAX_MEMBER >> 30} GiB read")
    fd = os.open(member["tar"], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("its tar is not a regular file")
        chunks, done = [], 0
        while done < size:
            chunk = os.pread(fd, size - done, offset + done)
            if not chunk:
                raise ValueError("truncated: the tar ends inside this member")
            chunks.append(chunk)
            done += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
