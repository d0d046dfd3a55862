"""What every way of reading SRC shares (class folders, a bucket, a manifest): how SRC is read
(``SourceOptions``), what a scan finds besides its sources (``Scan``), and whether a name is
text the store can hold (``utf8``, ``shown``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final
from urllib.parse import urlsplit

from tilefeed.store.choices import choice
from tilefeed.store.errors import ConfigError
from tilefeed.store.storage import OBJECT_SCHEMES



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
