"""What every way of reading SRC shares (class folders, a bucket, a manifest, image-text
sources): how SRC is read (``SourceOptions``, ``PairOptions``), what a scan finds besides its
sources (``Scan``), whether a name is text the store can hold (``utf8``, ``shown``), and the
checks every image-text reader applies to a sample's captions, fields and label
(``SampleRejected``, ``PairSink``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from tilefeed.store import format as fmt
from tilefeed.store.choices import choice
from tilefeed.store.errors import ConfigError, SourceError
from tilefeed.store.storage import OBJECT_SCHEMES

if TYPE_CHECKING:  # the command line reads this module's names without loading NumPy
    from tilefeed.preprocess.sources.pairs import PairTableWriter
    from tilefeed.preprocess.sources.source_list import SourceListWriter


class ClassLabels(StrEnum):
    """How the labels of SRC's sources are read (``--labels``); a member equals its string.

    ``AUTO``: integers if every label is one, names if none looks numeric. ``INT``: integer
    labels, the classes ``"0"`` up to the largest. ``NAMES``: class names, sorted.
    """

    AUTO = "auto"
    INT = "int"
    NAMES = "names"


LABEL_RULES: Final = tuple(rule.value for rule in ClassLabels)  # plain strings, for --labels' choices
BATCH: Final = 1 << 12  # sources handed to the list at once
NOT_UTF8: Final = ("unusable name: not valid UTF-8 (its bytes are shown as \\xNN), which the store's "
                   "text cannot hold; rename the file")


@dataclass(frozen=True)
class SourceOptions:
    """How SRC is read.

    Attributes
    ----------
    labels : ClassLabels or str, default "auto"
        How a manifest's labels are read (``--labels``); a ``ClassLabels`` once made.
    allow_duplicates, allow_outside, allow_empty_classes : bool, default False
        Relax the rules that catch mistakes: a path a manifest lists twice, a manifest's path
        outside its folder, a class folder with no files.
    buckets : tuple of str, default ()
        The buckets a manifest's URL rows may name (``s3://name``, or a bare ``name`` in any
        object store, or ``*`` for any); rows in other buckets are refused, as they would be
        read with this machine's cloud credentials.
    """

    labels: ClassLabels = ClassLabels.AUTO
    allow_duplicates: bool = False
    allow_outside: bool = False
    allow_empty_classes: bool = False
    buckets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", choice(ClassLabels, self.labels, "--labels"))
        allowed = []
        for bucket in self.buckets:
            text = bucket.strip().rstrip("/")
            if "://" in text:
                parts = urlsplit(text)
                if parts.scheme not in OBJECT_SCHEMES or not parts.hostname or "@" in parts.netloc:
                    raise ConfigError(f"--allow-bucket takes a bucket name or {OBJECT_SCHEMES[0]}://BUCKET "
                                      f"({', '.join(OBJECT_SCHEMES)}), got {bucket.split('@')[-1]!r}")
            elif not text or "/" in text:
                raise ConfigError(f"--allow-bucket takes a bucket name or s3://BUCKET, got {bucket!r}")
            allowed.append(text)
        object.__setattr__(self, "buckets", tuple(allowed))

    def bucket_allowed(self, url: str) -> bool:
        parts = urlsplit(url)
        here = f"{parts.scheme}://{parts.netloc}"
        return any(b == "*" or b == parts.netloc or b == here or url.startswith(b + "/") for b in self.buckets)


@dataclass(frozen=True, kw_only=True)
class Scan:
    """What a scan of SRC found besides the sources it listed."""

    classes: list[str]
    # (path, reason): inputs that cannot enter the store
    skipped: list[tuple[str, str]] = field(default_factory=list)
    hidden: int = 0  # hidden files and folders left out of a class-folder scan
    notes: list[str] = field(default_factory=list)  # what the summary should say about SRC


def utf8(text: str) -> bool:
    """True when ``text`` is valid Unicode: no lone surrogates, which a name read from the
    file system holds where its bytes are not UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(path: str) -> str:
    """``path`` as text the store can hold: bytes that are not UTF-8 written as ``\\xNN``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace") if not utf8(path) else path


class SourceKind(StrEnum):
    """What SRC is (``--source``); a member equals its string.

    ``AUTO``: decided from SRC itself (``finding.decide``). ``FOLDERS``: one subfolder per
    class. ``MANIFEST``: a CSV or JSON Lines of path,label. ``WEBDATASET``: tar shards of
    samples (img2dataset's layout). ``PARQUET``: rows holding each image's bytes. ``TABLE``: a
    caption table (TSV, CSV or JSON Lines of image path and caption), as open_clip reads one.
    """

    AUTO = "auto"
    FOLDERS = "folders"
    MANIFEST = "manifest"
    WEBDATASET = "webdataset"
    PARQUET = "parquet"
    TABLE = "table"


SOURCE_KINDS: Final = tuple(kind.value for kind in SourceKind)  # plain strings, for --source's choices
PAIR_KINDS: Final = (SourceKind.WEBDATASET, SourceKind.PARQUET, SourceKind.TABLE)  # sources with captions
# img2dataset's numeric fields and the sample's key: the fields kept when --fields is not given
DEFAULT_FIELDS: Final = ("key", "width", "height", "original_width", "original_height")
MAX_LABEL: Final = (1 << 20) - 1  # the largest --label-key value: the class list is sized by it


def _names(value: str | Iterable[str] | None, sep: str) -> tuple[str, ...] | None:
    """An option's list of names: a string split on ``sep``, or the names as given, each stripped."""
    if value is None:
        return None
    parts = value.split(sep) if isinstance(value, str) else list(value)
    return tuple(p.strip() for p in parts if p.strip())


@dataclass(frozen=True)
class PairOptions:
    """How an image-text SRC is read: which kind of source it is and where each sample's image,
    captions, fields and label are.

    Attributes
    ----------
    source : SourceKind or str, default "auto"
        What SRC is (``--source``); a ``SourceKind`` once made.
    image_key : tuple of str, default ("jpg", "png", "webp", "jpeg")
        A tar sample's image: its first member with one of these extensions, in this order
        (open_clip's ``--image-key``; a string is split on ``;``).
    caption_key : tuple of str, default ("caption",)
        The caption names kept. In a tar, ``caption`` is the ``.txt`` member (or the ``.json``
        member's ``caption``) and other names are the ``.json`` member's fields; in a parquet
        file or a table they are column names (a string is split on ``,``).
    fields : tuple of str, optional
        The metadata fields kept (``.json`` fields, columns); default ``DEFAULT_FIELDS``.
    image_column : str, optional
        A parquet file's image column; default the one Hugging Face ``datasets`` marks as an
        ``Image`` in the file's schema metadata, else ``image``.
    csv_img_key, csv_caption_key, csv_separator : str
        A caption table's image path column, caption column and separator (open_clip's
        ``--csv-img-key``, ``--csv-caption-key``, ``--csv-separator``: ``filepath``, ``title``
        and a tab).
    label_key : str, optional
        A class label per sample (a ``.json`` field, a column): integers >= 0. Without it the
        store is unlabelled: one class, ``image``, every label 0.
    """

    source: SourceKind = SourceKind.AUTO
    image_key: tuple[str, ...] = ("jpg", "png", "webp", "jpeg")
    caption_key: tuple[str, ...] = ("caption",)
    fields: tuple[str, ...] | None = None
    image_column: str | None = None
    csv_img_key: str = "filepath"
    csv_caption_key: str = "title"
    csv_separator: str = "\t"
    label_key: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", choice(SourceKind, self.source, "--source"))
        images = _names(self.image_key, ";") or ()
        object.__setattr__(self, "image_key", tuple(k.lower().lstrip(".") for k in images))
        object.__setattr__(self, "caption_key", _names(self.caption_key, ","))
        object.__setattr__(self, "fields", _names(self.fields, ","))
        if not self.image_key:
            raise ConfigError("--image-key names no extension (e.g. 'jpg;png;webp')")
        if not self.caption_key:
            raise ConfigError("--caption-key names no caption (e.g. 'caption')")
        if len(self.csv_separator) != 1:
            raise ConfigError(f"--csv-separator takes one character, got {self.csv_separator!r}")
        for name, value in (("--csv-img-key", self.csv_img_key), ("--csv-caption-key", self.csv_caption_key),
                            ("--image-column", self.image_column), ("--label-key", self.label_key)):
            if value is not None and not value.strip():
                raise ConfigError(f"{name} is empty")

    @property
    def field_names(self) -> tuple[str, ...]:
        """The fields kept: ``fields``, or ``DEFAULT_FIELDS``."""
        return DEFAULT_FIELDS if self.fields is None else self.fields

    @property
    def labelled(self) -> bool:
        """The samples carry class labels (``label_key``)."""
        return self.label_key is not None


class SampleRejected(Exception):
    """A sample of an image-text source that cannot enter the store; str() is the one-line reason."""


def checked_caption(value: Any, name: str) -> str | None:
    """A caption as the store holds it: stripped text, or None when absent or empty.

    Raises
    ------
    SampleRejected
        Not text, not valid Unicode, holding a NUL, or over ``MAX_TEXT_BYTES`` as UTF-8.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise SampleRejected(f"caption {name!r} is not text ({type(value).__name__})")
    if not utf8(value):
        raise SampleRejected(f"caption {name!r} is not valid UTF-8")
    text = value.strip()
    if "\0" in text:
        raise SampleRejected(f"caption {name!r} holds a NUL character")
    size = len(text.encode("utf-8"))
    if size > fmt.MAX_TEXT_BYTES:
        raise SampleRejected(f"caption {name!r} is {size} bytes, over the {fmt.MAX_TEXT_BYTES} a caption "
                             "may hold")
    return text or None


def caption_from_bytes(data: bytes, name: str) -> str | None:
    """``checked_caption`` of a caption file's bytes, which must be strict UTF-8."""
    if len(data) > 2 * fmt.MAX_TEXT_BYTES:  # stripped, it could not fit either
        raise SampleRejected(f"caption {name!r} is {len(data)} bytes, over the {fmt.MAX_TEXT_BYTES} a caption "
                             "may hold")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SampleRejected(f"caption {name!r} is not valid UTF-8 (byte {e.start})") from None
    return checked_caption(text, name)


def checked_field(name: str, value: Any) -> Any:
    """A field's value as the pair table keeps it: None (absent), a bool, int or float, or text
    (objects and lists as JSON text) of at most ``MAX_PATH_BYTES``.

    Raises
    ------
    SampleRejected
        Text that is not valid Unicode, holds a NUL, or is longer than a field may hold.
    """
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if not utf8(text) or "\0" in text:
        raise SampleRejected(f"field {name!r} is not valid UTF-8 text or holds a NUL")
    size = len(text.encode("utf-8"))
    if size > fmt.MAX_PATH_BYTES:
        raise SampleRejected(f"field {name!r} is {size} bytes, over the {fmt.MAX_PATH_BYTES} a field may hold")
    return value


def checked_label(name: str, value: Any) -> int:
    """A ``--label-key`` value: an integer >= 0 (or its text), at most ``MAX_LABEL``.

    Raises
    ------
    SampleRejected
        Absent, or not such an integer.
    """
    if isinstance(value, str) and value.strip().isdecimal() and value.strip().isascii():
        value = int(value.strip())
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LABEL:
        raise SampleRejected(f"label {name!r} is {value!r}, not an integer from 0 to {MAX_LABEL}")
    return value


class PairSink:
    """The sources of an image-text scan, to the source list and the pair table together, in
    store order, their captions, fields and labels checked; ``skipped`` gathers the rejects.

    Parameters
    ----------
    sink : SourceListWriter
        The scan's source list.
    table : PairTableWriter
        The scan's pair table, of ``options``' caption and field names.
    options : PairOptions
        Which captions, fields and label each sample keeps.
    """

    def __init__(self, sink: SourceListWriter, table: PairTableWriter, options: PairOptions) -> None:
        self.sink, self.table, self.options = sink, table, options
        self.skipped: list[tuple[str, str]] = []
        self.notes: list[str] = []
        self.top = -1  # the largest label listed
        self._paths: list[bytes] = []
        self._labels: list[int] = []

    def sample(self, path: str, captions: Mapping[str, Any], fields: Mapping[str, Any],
               member: Mapping[str, Any] | None = None) -> None:
        """One sample: listed, or a reject with the reason when its captions, fields or label
        are not what the store holds. ``captions`` and ``fields`` map names to raw values (a
        caption already checked stays as it is); ``fields`` also holds the label, if any."""
        try:
            texts = {}
            for name in self.options.caption_key:
                text = checked_caption(captions.get(name), name)
                if text is not None:
                    texts[name] = text
            if not texts:
                raise SampleRejected(f"no caption: none of {', '.join(self.options.caption_key)} is given")
            kept = {name: checked_field(name, fields.get(name)) for name in self.options.field_names}
            label = 0
            if self.options.label_key is not None:
                label = checked_label(self.options.label_key, fields.get(self.options.label_key))
        except SampleRejected as e:
            self.reject(path, str(e))
            return
        if not utf8(path) or "\0" in path:
            self.reject(shown(path), NOT_UTF8)
            return
        self.table.add(texts, {k: v for k, v in kept.items() if v is not None}, member)
        self._paths.append(path.encode("utf-8"))
        self._labels.append(label)
        self.top = max(self.top, label)
        if len(self._paths) == BATCH:
            self.flush()

    def reject(self, path: str, reason: str) -> None:
        """An input that cannot enter the store, with its one-line reason."""
        self.skipped.append((shown(path), " ".join(reason.split())))

    def flush(self) -> None:
        """Hand the samples held to the source list."""
        if self._paths:
            import numpy as np  # here, not at the top: the command line loads this module

            self.sink.add(self._paths, np.array(self._labels, dtype=np.int64))
            self._paths, self._labels = [], []

    def scan(self) -> Scan:
        """What the scan found besides its sources, once every sample is in (held ones flushed)."""
        self.flush()
        classes = [str(i) for i in range(self.top + 1)] if self.options.labelled else ["image"]
        return Scan(classes=classes or ["0"], skipped=self.skipped, notes=self.notes)


def no_images(what: str) -> SourceError:
    """The refusal of an image-text SRC that lists nothing at all."""
    return SourceError(f"SRC {what} holds no samples")
