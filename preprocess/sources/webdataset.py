"""WebDataset tar shards (img2dataset's output): each sample a run of tar members sharing a key,
its image (``--image-key``: the first extension present, in order), its caption (``.txt``) and
its metadata (``.json``).

SRC is a brace pattern (``shards/{00000..00009}.tar``, numeric ranges padded as written, comma
lists), a folder of ``.tar`` files, one ``.tar``, or a ``.txt`` list of tar paths (one a line,
relative to the list's folder and held inside it as a manifest's rows are; a URL line only in a
bucket ``--allow-bucket`` names). Each may be in a bucket (``s3://bucket/shards/{0..9}.tar``, a
prefix ending in ``/`` whose ``.tar`` objects are the shards, a ``.txt`` list object whose
lines are keys relative to its own prefix). Shards are read in sorted order; a sample's key is
its member's name up to the first dot of the base name (its folder kept), its extension the
rest, lower-cased, as WebDataset's ``base_plus_ext`` splits it.

A tar is read with ``tarfile`` in seekable mode and never extracted: each sample is listed with
its image's *member* (the tar's real path, the data's offset and size), which a worker reads
with one ``pread`` (``read_member``). A tar in a bucket is never downloaded: its headers are
read through ranged GETs (``RangedFile``), each of the read and ``TAR_READ_AHEAD`` bytes after
it; member data past that window is skipped by seeking. A bucket member's locator also holds
the object's size and ETag, so that the worker's one ranged GET of the image is refused if the
object changed since the scan, and a resumed run's fingerprint changes only when the objects do.

Every name is untrusted: a member that is a link, a device or a fifo, whose name is absolute or
climbs out with ``..``, or is not UTF-8, rejects its sample with the reason and is never
followed. Header data (long names, pax attributes) is read up to ``MAX_HEADER_DATA``, a ``.json``
member up to ``MAX_JSON``, a ``.txt`` caption up to what a caption may hold; an image member
over ``MAX_MEMBER`` is a reject, and so is a sample of more than ``MAX_SAMPLE_MEMBERS`` members
(none of which is kept past the limit). A truncated or corrupt tar (an object that is no tar at all
included) keeps the samples read before the damage and is itself a reject naming the error.

Beside a shard, img2dataset writes ``NAME.parquet`` with a row per sample it tried: its rows
whose ``status`` is not ``success`` become rejects with its ``error_message`` (``download failed:
...``; ``decode or resize failed: ...`` for its ``failed_to_resize``, which covers an image that
did not decode as well as one its size checks refused), when pyarrow is installed; in a bucket
it is read through ranged GETs too.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from tilefeed.preprocess.sources.manifest import path_resolver
from tilefeed.preprocess.sources.objects import (URL, BucketObject, ObjectChanged, RangedFile, bucket_client,
                                                 bucket_resolver, bucket_url, list_objects, read_range,
                                                 stat_object)
from tilefeed.preprocess.sources.scanning import (PairOptions, PairSink, SampleRejected, Scan, SourceOptions,
                                                  caption_from_bytes, utf8)
from tilefeed.store import format as fmt
from tilefeed.store.errors import SourceError
from tilefeed.store.storage import redact

if TYPE_CHECKING:
    pass

MAX_SHARDS: Final = 1 << 20  # shards a pattern or a list may name
MAX_JSON: Final = 1 << 20  # a sample's .json member
MAX_HEADER_DATA: Final = 1 << 20  # one read of tar header data: a long name, pax attributes
MAX_MEMBER: Final = 1 << 30  # one image member
MAX_SAMPLE_MEMBERS: Final = 64  # members of one key: a sample of more is a reject, its entries dropped
MAX_LIST_BYTES: Final = 64 << 20  # a .txt list of shards
# A bucket tar's read-ahead: member data inside it is read through (one request costs more than
# a megabyte on most object stores), larger members are skipped by seeking; the scan holds at
# most twice this.
TAR_READ_AHEAD: Final = 1 << 20
_BRACE: Final = re.compile(r"\{([^{}]*)\}")
_RANGE: Final = re.compile(r"(\d+)\.\.(\d+)")
_KEY: Final = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # WebDataset's base_plus_ext
# img2dataset's statuses of a sample not written, as a reject's reason starts
_FAILED: Final = {"failed_to_download": "download failed", "failed_to_resize": "decode or resize failed"}


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


# -- which shards ---------------------------------------------------------------------------------
def shard_paths(src: str, options: SourceOptions) -> list[str]:
    """SRC's shards as absolute paths or URLs, sorted, each once (a missing one is the scan's
    reject).

    Raises
    ------
    SourceError
        A URL that is no bucket's, a pattern naming too many shards, a list that cannot be read
        or names a path outside its folder (or a bucket not allowed), or no shard at all.
    """
    if URL.match(src):
        return _bucket_shards(bucket_url(src), options)
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


def _bucket_shards(src: str, options: SourceOptions) -> list[str]:
    """The shards of a bucket SRC: a pattern's URLs, a ``.tar`` object, a ``.txt`` list object's
    lines, or the ``.tar`` objects under a prefix."""
    key = src.split("/", 3)[3] if src.count("/") >= 3 else ""
    if is_pattern(key):
        found = expand_braces(src)
    elif key.lower().endswith(".tar"):
        found = [src]
    elif key.lower().endswith(".txt"):
        found = _listed_objects(src, options)
    else:
        objects, _ = list_objects(src)
        found = [o.url for o in objects if o.url.lower().endswith(".tar")]
        if not found:
            raise SourceError(f"SRC {src!r} holds no .tar objects (or is no prefix of this bucket)")
    return sorted(set(found))


def _lines(data: bytes, where: str) -> list[str]:
    try:
        return data.decode("utf-8-sig").splitlines()
    except UnicodeDecodeError:
        raise SourceError(f"{where!r} is not UTF-8 text") from None


def _listed_shards(listing: Path, options: SourceOptions) -> list[str]:
    """The tars a ``.txt`` list names, resolved against its folder (a URL line: only in a bucket
    ``--allow-bucket`` names)."""
    try:
        size = listing.stat().st_size
        if size > MAX_LIST_BYTES:
            raise SourceError(f"{str(listing)!r} is {size} bytes, over the {MAX_LIST_BYTES >> 20} MiB a shard "
                              "list may hold")
        lines = _lines(listing.read_bytes(), str(listing))
    except OSError as e:
        raise SourceError(f"cannot read {str(listing)!r}: {e.strerror or e}") from None
    resolve = path_resolver(listing, options)

    def named(number: int, text: str) -> str:
        if "\0" in text:
            raise SourceError(f"{listing}:{number}: the path holds a NUL")
        return resolve(number, text)[0]

    return _named_shards(lines, named, str(listing))


def _listed_objects(listing: str, options: SourceOptions) -> list[str]:
    """The tars a ``.txt`` list object names, as keys beside it (``bucket_resolver``)."""
    from tilefeed.store.errors import CorruptChunkError

    storage, key = bucket_client(listing)
    try:
        data = storage.read_capped(key, MAX_LIST_BYTES)
    except FileNotFoundError:
        raise SourceError(f"SRC {listing!r} does not exist") from None
    except CorruptChunkError:
        raise SourceError(f"{listing!r} is over the {MAX_LIST_BYTES >> 20} MiB a shard list may hold") from None
    return _named_shards(_lines(data, listing), bucket_resolver(listing, options), listing)


def _named_shards(lines: list[str], resolve: Callable[[int, str], str], listing: str) -> list[str]:
    found = []
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        found.append(resolve(number, text))
        if len(found) > MAX_SHARDS:
            raise SourceError(f"{listing!r} names more than the {MAX_SHARDS} shards a run reads")
    if not found:
        raise SourceError(f"{listing!r} names no shard")
    return found


def scan_webdataset(src: str, options: SourceOptions, pairs: PairOptions, out: PairSink) -> Scan:
    """Every sample of SRC's shards into ``out``, shard by shard (sorted), in tar order.

    Raises
    ------
    SourceError
        As ``shard_paths``; and a bucket pattern none of whose objects exists.
    """
    shards = shard_paths(src, options)
    out.notes.append(f"SRC read as webdataset shards ({len(shards)} tar{'s' if len(shards) > 1 else ''})")
    found = sum(_scan_tar(shard, pairs, out) for shard in shards)
    if not found and URL.match(src) and is_pattern(src):
        raise SourceError(f"SRC {src!r}: the pattern matches no object")
    return out.scan()


class _BoundedReads:
    """A tar file for ``tarfile``: any one read past ``MAX_HEADER_DATA`` (what a header that
    declares huge long-name or pax data would ask) fails instead of allocating it."""

    def __init__(self, f: io.BufferedReader | RangedFile) -> None:
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


_Pread = Callable[[int, int], bytes]  # (offset, count) -> up to count bytes of a tar at offset


def _scan_tar(shard: str, pairs: PairOptions, out: PairSink) -> bool:
    """One tar's samples into ``out``; the tar itself a reject when it cannot be read whole.
    False when the tar is not there at all."""
    if URL.match(shard):
        return _scan_object(shard, pairs, out)
    try:
        fd = os.open(shard, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        out.reject(shard, "missing: file not found")
        return False
    except OSError as e:
        out.reject(shard, f"unreadable: {e.strerror or e}")
        return True
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            out.reject(shard, "not a regular file")
            return True
        # its size and time of change, in the run's fingerprint: a member records only where its
        # bytes lie, so a tar rewritten in place must still change the run
        out.table.container(os.path.realpath(shard), info.st_size, info.st_mtime_ns)
        _read_tar(_BoundedReads(f), lambda offset, count: os.pread(fd, count, offset), info.st_size, shard,
                  {"tar": os.path.realpath(shard)}, pairs, out)
    _failed_downloads(shard, out)
    return True


def _scan_object(url: str, pairs: PairOptions, out: PairSink) -> bool:
    """A tar in a bucket, read through ranged GETs (``RangedFile``), never downloaded."""
    try:
        obj = stat_object(url)  # a refusal of the bucket (credentials, no such bucket) stops the run
    except FileNotFoundError:
        out.reject(url, "missing: object not found")
        return False
    ranged = RangedFile(obj, TAR_READ_AHEAD)
    # the object's size and ETag: the worker's read is refused if it changed, and a resumed
    # run's fingerprint (which covers every locator) changes with it
    locator = {"tar": url, "tar_size": obj.size, **({"etag": obj.etag} if obj.etag else {})}
    _read_tar(_BoundedReads(ranged), ranged.pread, obj.size, url, locator, pairs, out)
    _failed_downloads(url, out)
    return True


def _read_tar(f: _BoundedReads, pread: _Pread, size: int, shard: str, locator: dict[str, Any],
              pairs: PairOptions, out: PairSink) -> None:
    """The samples of the tar ``f`` (``size`` bytes, also read by ``pread``) into ``out``, each
    member's locator ``locator`` with its offset and size; the tar a reject where it is damaged."""
    from tilefeed.store.errors import StoreAccessError

    samples = 0
    group: _Sample | None = None
    try:
        tar = tarfile.open(fileobj=f, mode="r:")  # type: ignore[call-overload]
        while (member := tar.next()) is not None:
            tar.members.clear()  # read as a stream: nothing held per member
            if member.isdir():
                continue
            problem = _unsafe(member, size)
            found = _KEY.match(member.name)  # a refused member spoils the sample of its key
            key, ext = (found[1], found[2].lower()) if found else (member.name, "")
            if problem is None and (found is None or os.path.basename(key).startswith("__")):
                continue  # no extension, or WebDataset's __meta__ entries: not part of a sample
            if group is None or group.key != key:
                if group is not None:
                    samples += _sample(group, pread, shard, locator, pairs, out)
                group = _Sample(key)
            if group.problem is None and problem is None:
                if ext in group.members:
                    problem = f"a second .{ext} member in one sample"
                elif len(group.members) >= MAX_SAMPLE_MEMBERS:
                    problem = f"more than the {MAX_SAMPLE_MEMBERS} members a sample may hold"
            if group.problem is not None:
                continue  # the sample is a reject already: nothing more of it is kept
            if problem is not None:
                group.problem = (member.name, problem)
                group.members.clear()
            else:
                group.members[ext] = member
        end = tar.offset
    except (StoreAccessError, ObjectChanged) as e:  # the bucket failed, not the tar
        if group is not None:
            samples += _sample(group, pread, shard, locator, pairs, out)
        out.reject(shard, f"unreadable after {samples} samples (those kept): {redact(str(e))}")
        return
    except Exception as e:  # noqa: BLE001 - whatever a damaged tar raises: the tar is the reject
        if group is not None:
            samples += _sample(group, pread, shard, locator, pairs, out)
        out.reject(shard, f"corrupt or truncated tar after {samples} samples (those kept): "
                          f"{type(e).__name__}: {e}")
        return
    if group is not None:
        samples += _sample(group, pread, shard, locator, pairs, out)
    marker = pread(end, 512)
    if len(marker) < 512:
        out.reject(shard, f"truncated tar: it ends without its end-of-archive blocks, after {samples} "
                          "samples (those kept)")
    elif marker.count(0) != 512:
        out.reject(shard, f"corrupt tar: an unreadable header at byte {end}, after {samples} samples "
                          "(those kept)")


def _read(pread: _Pread, info: tarfile.TarInfo) -> bytes:
    return pread(info.offset_data, info.size)


def _sample(group: _Sample, pread: _Pread, shard: str, locator: dict[str, Any], pairs: PairOptions,
            out: PairSink) -> int:
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
            meta = _metadata(pread, group.members["json"])
        captions: dict[str, Any] = {name: meta.get(name) for name in pairs.caption_key}
        if "caption" in pairs.caption_key and "txt" in group.members:
            text = group.members["txt"]
            if text.size > 2 * fmt.MAX_TEXT_BYTES:  # stripped, it could not fit either: left unread
                raise SampleRejected(f"caption 'caption' is {text.size} bytes, over the {fmt.MAX_TEXT_BYTES} a "
                                     "caption may hold")
            caption = caption_from_bytes(_read(pread, text), "caption")
            if caption is not None:  # an empty .txt leaves the .json's caption, if any
                captions["caption"] = caption
    except SampleRejected as e:
        out.reject(where, str(e))
        return 1
    fields = dict(meta)
    fields.setdefault("key", os.path.basename(group.key))
    member = {"tar": locator["tar"], "offset": image.offset_data, "size": image.size}
    member.update((k, v) for k, v in locator.items() if k != "tar")  # a bucket tar's size and ETag
    out.sample(where, captions, fields, member)
    return 1


def _metadata(pread: _Pread, info: tarfile.TarInfo) -> dict[str, Any]:
    """A sample's ``.json`` member: a JSON object of at most ``MAX_JSON`` bytes."""
    if info.size > MAX_JSON:
        raise SampleRejected(f"metadata too large: {os.path.basename(info.name)} is {info.size} bytes, over "
                             f"the {MAX_JSON >> 20} MiB read")
    try:
        meta = json.loads(_read(pread, info))
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
    source: Path | BucketObject = Path(table)
    if URL.match(shard):
        try:
            source = stat_object(table)
        except FileNotFoundError:
            return
        except OSError as e:
            out.notes.append(f"{table!r} not read: {redact(str(e))}")
            return
    elif not os.path.isfile(table):
        return
    from tilefeed.preprocess.sources.parquet import NEEDS_PYARROW, open_checked

    try:
        pf = open_checked(source, lambda schema: [n for n in ("key", "status", "error_message")
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
        out.notes.append(f"{table!r} not read: {type(e).__name__}: {redact(str(e))}")


def read_member(member: dict[str, Any]) -> bytes:
    """A tar member's bytes (a worker's read): one ``pread``, the tar opened without following
    a link (the scan recorded its real path) or waiting on a pipe; or, for a tar in a bucket,
    one ranged GET on the condition that the object is the one the scan read.

    Raises
    ------
    ValueError
        A member over ``MAX_MEMBER``, a tar that is no longer a regular file, or one that ends
        before the member does; ``ObjectChanged`` for a bucket tar replaced since the scan.
    OSError
        The tar cannot be opened or read (``FileNotFoundError``: it is gone).
    """
    size, offset = int(member["size"]), int(member["offset"])
    if not 0 <= size <= MAX_MEMBER or offset < 0:
        raise ValueError(f"a member of {size} bytes, over the {MAX_MEMBER >> 30} GiB read")
    if URL.match(str(member["tar"])):
        return _read_object_member(member, offset, size)
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


def _read_object_member(member: dict[str, Any], offset: int, size: int) -> bytes:
    """A bucket tar's member: its range checked against the object's size the scan read, then
    one ranged GET."""
    url = bucket_url(str(member["tar"]), "a member's tar")
    tar_size = int(member.get("tar_size", offset + size))
    if offset + size > tar_size:
        raise ValueError("truncated: the tar ends inside this member")
    etag = member.get("etag")
    data = read_range(BucketObject(url, tar_size, str(etag) if etag else None), offset, offset + size)
    if len(data) != size:
        raise ValueError("truncated: the tar ends inside this member")
    return data
