"""Sources with targets: a COCO instances JSON beside an image folder, a YOLO folder
(``images/`` and ``labels/``), or an image folder with a folder of semantic masks.

The scan lists the images as every scan does (label 0, the one class ``image``) and decides
what the whole run depends on: the category table, and, for COCO, which annotations belong to
which image. A file that cannot be read that way (malformed JSON, a category table with a
repeated or non-integer id, an annotation naming no image of the file, an image listed twice)
refuses the run in one line naming the file and the entry. Everything about one image (a box
outside it, a degenerate box, a category not in the table, a mask of another size) is left to
the worker that decodes it, which rejects that image with the reason (``preprocess.targets``).

What a worker needs per source travels as bytes: a COCO image's annotations as one JSON line
of a file on disk (``records``), indexed by source, read for a part as one byte range; a YOLO
label file or a semantic mask is found from the image's own path.
"""

from __future__ import annotations

import hashlib
import json
import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from tilefeed.preprocess.settings import TargetKind, TargetOptions, size_text
from tilefeed.preprocess.sources.folders import IMAGE_CLASS, scan_images
from tilefeed.preprocess.sources.scanning import Scan, utf8
from tilefeed.preprocess.sources.source_list import SourceListWriter
from tilefeed.store.errors import SourceError
from tilefeed.store.format import MASK_IGNORE, MAX_CATEGORIES, MAX_CATEGORY_ID, MaskKind

RECORDS: Final = "records"  # COCO: one JSON line per source, its size and annotations
RECORD_INDEX: Final = "records.index"  # little-endian int64 offsets of each line, and the end
YOLO_IMAGES: Final = "images"
YOLO_LABELS: Final = "labels"
CLASSES_TXT: Final = "classes.txt"
DATA_YAML: Final = "data.yaml"


@dataclass(frozen=True)
class TargetJob:
    """What a worker needs to read the targets of a part's images: a few strings and numbers,
    sent once with each part task.

    Attributes
    ----------
    kind : TargetKind
        Where the targets come from.
    masks : MaskKind or None
        The masks the store holds.
    category_ids : tuple of int
        The ids of the category table (empty: a semantic set without a table, any id).
    root : str
        SRC: YOLO's folder of ``images/`` and ``labels/``; the semantic set's image folder.
    mask_dir : str
        The semantic masks' folder, of a mask set or beside a COCO file ('' otherwise).
    """

    kind: TargetKind
    masks: MaskKind | None
    category_ids: tuple[int, ...]
    root: str
    mask_dir: str = ""


@dataclass(frozen=True)
class TargetSource:
    """A scan's targets: the job its workers are sent, the category table, what identifies the
    annotations for a resumed run, and (COCO) the records on disk."""

    job: TargetJob
    categories: tuple[tuple[int, str], ...]
    identity: str  # sha256 of the annotation file (COCO), or of the settings and table
    records: Path | None = None  # COCO: the folder of RECORDS and RECORD_INDEX

    def read(self, first: int, count: int) -> bytes:
        """The records of sources [first, first + count): their JSON lines, back to back
        (b'' where there are none)."""
        if self.records is None:
            return b""
        index = self.records / RECORD_INDEX
        last = index.stat().st_size // 8 - 1  # the index holds each line's offset, then the end
        start = int(np.fromfile(index, dtype="<i8", count=1, offset=8 * first)[0])
        stop = int(np.fromfile(index, dtype="<i8", count=1, offset=8 * min(first + count, last))[0])
        with open(self.records / RECORDS, "rb") as f:
            f.seek(start)
            return f.read(stop - start)


def scan_targets(src: Path, options: TargetOptions, exclude: Path | None, sink: SourceListWriter,
                 scratch: Path) -> tuple[Scan, TargetSource]:
    """The images of SRC into ``sink`` and the targets' table; SourceError for a file the run
    cannot be made from."""
    kind = options.kind
    if kind is TargetKind.COCO:
        assert options.annotations is not None
        mask_dir = ""
        if options.masks is not None:  # their ids are the file's categories: a table of their own would clash
            mask_dir = str(_mask_folder(src, Path(options.masks)))
            if (Path(options.masks) / CLASSES_TXT).exists():
                raise SourceError(f"--masks {options.masks!r} with --annotations: the masks' class ids are the "
                                  f"annotation file's category ids, which its {CLASSES_TXT} would name again")
        scanned = _scan_coco(src, Path(options.annotations), options.mask_kind, sink, scratch,
                             options.max_annotations_size, mask_dir)
        wide = [i for i in scanned[1].job.category_ids if not 0 <= i < MASK_IGNORE]
        if mask_dir and wide:  # an 8-bit mask holds 0..254, and 255 is "ignore"
            raise SourceError(f"--masks with --annotations {options.annotations!r}: category id {wide[0]} "
                              f"cannot be a mask's class id (8-bit masks hold 0 to {MASK_IGNORE - 1}; "
                              f"{MASK_IGNORE} means ignore)")
        return scanned
    if kind is TargetKind.YOLO:
        images, labels = src / YOLO_IMAGES, src / YOLO_LABELS
        if not images.is_dir() or not labels.is_dir():
            raise SourceError(f"--yolo: SRC {str(src)!r} must hold the folders {YOLO_IMAGES}/ and "
                              f"{YOLO_LABELS}/")
        categories = _yolo_names(src)
        scan = scan_images(images, exclude, sink, scratch)
        job = TargetJob(TargetKind.YOLO, None, tuple(i for i, _ in categories), str(src))
    else:
        assert options.masks is not None
        masks = _mask_folder(src, Path(options.masks))
        table = masks / CLASSES_TXT
        categories = _classes_txt(table, MASK_IGNORE - 1) if table.is_file() else ()
        scan = scan_images(src, exclude, sink, scratch)
        job = TargetJob(TargetKind.SEMANTIC, MaskKind.SEMANTIC, tuple(i for i, _ in categories), str(src),
                        str(masks))
    described = json.dumps([job.kind.value, job.root, job.mask_dir, categories])
    identity = hashlib.sha256(described.encode()).hexdigest()
    return scan, TargetSource(job, categories, identity)


def _mask_folder(src: Path, masks: Path) -> Path:
    """``masks``, a folder beside SRC; SourceError otherwise."""
    if not masks.is_dir():
        raise SourceError(f"--masks {str(masks)!r} is not a folder")
    if src.resolve() in (masks.resolve(), *masks.resolve().parents):
        raise SourceError(f"--masks {str(masks)!r} lies inside SRC, whose every file is an image: "
                          "put the masks beside it")
    return masks


# -- COCO -----------------------------------------------------------------------------------------
def _scan_coco(src: Path, annotations: Path, masks: MaskKind | None, sink: SourceListWriter,
               scratch: Path, most: int, mask_dir: str = "") -> tuple[Scan, TargetSource]:
    where = f"--annotations {str(annotations)!r}"
    if not src.is_dir():
        raise SourceError(f"SRC {str(src)!r} must be the image folder of {where}")
    raw = _read_annotations(annotations, where, most)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise SourceError(f"{where}: not JSON: {str(e).splitlines()[0][:200]}") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list)
                                             for k in ("images", "annotations", "categories")):
        raise SourceError(f"{where}: not a COCO instances file (lists images, annotations and categories)")
    categories = _coco_categories(data["categories"], where)
    images = _coco_images(data["images"], where, src)
    by_image: dict[int, list[dict[str, Any]]] = {image_id: [] for image_id, _, _, _ in images}
    for k, ann in enumerate(data["annotations"]):
        ann_id = ann.get("id") if isinstance(ann, dict) else None
        image_id = ann.get("image_id") if isinstance(ann, dict) else None
        if not _whole(ann_id) or not _whole(image_id):
            raise SourceError(f"{where}: annotation {k} has no whole-number id and image_id")
        if image_id not in by_image:
            raise SourceError(f"{where}: annotation {ann_id} names image_id {image_id}, not an image of "
                              "the file")
        by_image[image_id].append(ann)
    folder = scratch / "targets"
    folder.mkdir(parents=True, exist_ok=True)
    offsets = [0]
    with open(folder / RECORDS, "wb") as f:
        for image_id, _, width, height in images:
            entry = {"w": width, "h": height, "a": by_image[image_id]}
            line = json.dumps(entry, separators=(",", ":")).encode()
            f.write(line + b"\n")  # JSON text holds no raw newline
            offsets.append(offsets[-1] + len(line) + 1)
    np.array(offsets, dtype="<i8").tofile(folder / RECORD_INDEX)
    paths = [os.path.join(str(src), name).encode() for _, name, _, _ in images]
    sink.add(paths, 0)
    job = TargetJob(TargetKind.COCO, masks, tuple(i for i, _ in categories), str(src), mask_dir)
    digest = hashlib.sha256(raw)
    if mask_dir:  # and the masks' folder (their files' sizes join the fingerprint as a mask set's do)
        digest.update(b"\0masks\0" + mask_dir.encode())
    identity = digest.hexdigest()
    return Scan(classes=[IMAGE_CLASS]), TargetSource(job, categories, identity, folder)


class NotAFile(OSError):
    """``read_bounded`` was given a pipe, a device or a folder: nothing with a size to check."""


class TooLarge(Exception):
    """A file over the limit ``read_bounded`` was given: ``size`` bytes by its ``fstat``, or None
    when it grew past the limit while it was read."""

    def __init__(self, size: int | None) -> None:
        super().__init__(size)
        self.size = size


def read_bounded(path: str | os.PathLike[str], most: int) -> bytes:
    """A regular file's bytes, at most ``most`` of them, checked before a byte is read.

    The file is opened without blocking (the open of a pipe would itself wait for a writer),
    its kind and size are read on the open file, and the read stops one byte past ``most``, so a
    file that grows meanwhile is caught too.

    Parameters
    ----------
    path : str or path-like
        The file.
    most : int
        The largest size read.

    Returns
    -------
    bytes
        Its contents.

    Raises
    ------
    TooLarge
        Over ``most`` bytes, by its size or as read.
    OSError
        Unreadable (FileNotFoundError when absent; ``NotAFile`` for a pipe, a device or a
        folder).
    """
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
        stats = os.fstat(f.fileno())
        if not stat.S_ISREG(stats.st_mode):
            raise NotAFile(errno.EINVAL, "not a regular file")
        if stats.st_size > most:
            raise TooLarge(stats.st_size)
        raw = f.read(most + 1)
    if len(raw) > most:
        raise TooLarge(None)
    return raw


def _read_annotations(path: Path, where: str, most: int) -> bytes:
    """The file's bytes, refused unread when it is over ``most`` bytes or not a regular file
    (``read_bounded``). Nothing the scan or the workers make is sized by a count the file
    declares: its images, annotations and polygon points are lists the parse builds, so the
    file's size bounds them all."""
    try:
        return read_bounded(path, most)
    except TooLarge as e:
        size = "grew while read" if e.size is None else f"{e.size} bytes ({size_text(e.size)})"
        raise SourceError(f"{where}: {size}, over the {size_text(most)} limit; "
                          "--max-annotations-size raises it") from None
    except NotAFile:
        raise SourceError(f"{where}: not a regular file") from None
    except OSError as e:
        raise SourceError(f"{where}: cannot read: {e.strerror or e}") from None


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _coco_categories(entries: list[Any], where: str) -> tuple[tuple[int, str], ...]:
    """The file's categories by id: a repeated, negative or non-integer id, or a name that is
    not text, refuses the run (every image's objects are read against this table)."""
    if len(entries) > MAX_CATEGORIES:
        raise SourceError(f"{where}: {len(entries)} categories, more than {MAX_CATEGORIES}")
    table: dict[int, str] = {}
    for k, cat in enumerate(entries):
        cid: Any = cat.get("id") if isinstance(cat, dict) else None
        name = cat.get("name") if isinstance(cat, dict) else None
        if not _whole(cid) or not 0 <= cid <= MAX_CATEGORY_ID or not isinstance(name, str) or not utf8(name):
            raise SourceError(f"{where}: category {k} needs a whole-number id in 0..{MAX_CATEGORY_ID} "
                              "and a name")
        if cid in table:
            raise SourceError(f"{where}: category id {cid} is listed twice ({table[cid]!r} and {name!r})")
        table[cid] = name
    if not table:
        raise SourceError(f"{where}: lists no categories")
    return tuple(sorted(table.items()))


def _coco_images(entries: list[Any], where: str, src: Path) -> list[tuple[int, str, int, int]]:
    """(id, file_name, width, height) of each image in the file's order; an entry without them,
    an id or file_name listed twice, or a file_name leading out of SRC refuses the run."""
    seen_ids: set[int] = set()
    seen_names: set[str] = set()
    out: list[tuple[int, str, int, int]] = []
    for k, image in enumerate(entries):
        values: list[Any] = [image.get(key) if isinstance(image, dict) else None
                  for key in ("id", "file_name", "width", "height")]
        image_id, name, width, height = values
        if (not _whole(image_id) or not isinstance(name, str) or not name or "\0" in name or not utf8(name)
                or not _whole(width) or not _whole(height) or width < 1 or height < 1):
            raise SourceError(f"{where}: image {k} needs a whole-number id, a file_name and a positive width "
                              "and height")
        if os.path.isabs(name) or ".." in Path(name).parts:
            raise SourceError(f"{where}: image {image_id}'s file_name {name!r} leads out of SRC {str(src)!r}")
        if image_id in seen_ids:
            raise SourceError(f"{where}: image id {image_id} is listed twice")
        if name in seen_names:
            raise SourceError(f"{where}: file_name {name!r} is listed twice")
        seen_ids.add(image_id)
        seen_names.add(name)
        out.append((image_id, name, width, height))
    if not out:
        raise SourceError(f"{where}: lists no images")
    return out


# -- category tables of YOLO and semantic sets ----------------------------------------------------
def _classes_txt(path: Path, most: int) -> tuple[tuple[int, str], ...]:
    """One class name a line, the first id 0 (as YOLO's classes.txt and LabelImg write it)."""
    try:
        names = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"{str(path)!r}: cannot read as UTF-8 text: {e}") from None
    while names and not names[-1].strip():
        names.pop()
    if not names or len(names) > most + 1 or any(not n.strip() for n in names):
        raise SourceError(f"{str(path)!r}: must name 1 to {most + 1} classes, one a line, none empty")
    return tuple((i, n.strip()) for i, n in enumerate(names))


def _yolo_names(src: Path) -> tuple[tuple[int, str], ...]:
    """The class table of a YOLO set: ``names`` of ``data.yaml`` (a list, or ids to names), or
    ``classes.txt``; without either the run is refused (a class id must name something)."""
    yaml_path = src / DATA_YAML
    if yaml_path.is_file():
        import yaml

        try:
            doc = yaml.safe_load(yaml_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise SourceError(f"{str(yaml_path)!r}: cannot read: {str(e).splitlines()[0]}") from None
        names = doc.get("names") if isinstance(doc, dict) else None
        if isinstance(names, list):
            names = dict(enumerate(names))
        if (not isinstance(names, dict) or not names or len(names) > MAX_CATEGORIES
                or not all(_whole(i) and 0 <= i <= MAX_CATEGORY_ID and isinstance(n, str)
                           for i, n in names.items())):
            raise SourceError(f"{str(yaml_path)!r}: 'names' must list class names, or map whole-number ids "
                              "to them")
        return tuple(sorted(names.items()))
    if (src / CLASSES_TXT).is_file():
        return _classes_txt(src / CLASSES_TXT, MAX_CATEGORIES - 1)
    raise SourceError(f"--yolo: SRC {str(src)!r} names its classes in neither {DATA_YAML} ('names') "
                      f"nor {CLASSES_TXT}")

