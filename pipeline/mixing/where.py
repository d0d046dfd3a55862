"""``Loader(where=...)``: the samples of a store whose metadata fields pass a test, found once
when the Loader opens, before anything is decoded.

The test is an expression (``options.parse_where`` checks its syntax) evaluated over whole
field arrays, one value a sample, or a callable given those arrays. What passes becomes the
store's subset, as ``indices`` does: the order, exactly-once sharding, the ledger and elastic
resume then hold over it, and a saved state names a digest of it (a resume under another filter
is refused). A missing number (NaN) fails every comparison but ``!=``; a missing string is "".
"""

from __future__ import annotations

import ast
import io
import operator
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import numpy as np

from tilefeed.pipeline.options import Where
from tilefeed.store.errors import ConfigError, one_line

MAX_ID_FILE_BYTES: Final = 1 << 30  # a file of ids: DataComp's largest subsets are a few GB of uids
_OPS: Final[dict[type, Callable[[Any, Any], Any]]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
}


def select(reader: Any, where: Where, location: str) -> np.ndarray:
    """The samples of ``reader``'s store that pass ``where``, ascending; a ConfigError naming
    the store where a field is missing, a value cannot be compared or nothing passes."""
    from tilefeed.store.pairs import check_held, read_pairs, sample_rows

    meta = reader.meta
    names = where.names if where.test is None else tuple(n for n, _ in meta.fields)
    check_held(meta, (), names, location, asked="where")
    owners = sample_rows(reader.root, meta)  # each sample's row of the fields
    held = read_pairs(reader.root, meta, texts=(), fields=names).fields
    columns = {n: held[n][owners] for n in names}
    if where.test is not None:
        try:
            mask = np.asarray(where.test(columns))
        except Exception as e:  # noqa: BLE001 - the caller's function: its failure, named
            raise ConfigError(f"where: the function raised {type(e).__name__}: {e}") from None
        if mask.dtype != np.bool_ or mask.shape != (len(owners),):
            raise ConfigError(f"where: the function must return a boolean array of one value per sample "
                              f"({len(owners)},), got {mask.dtype} {mask.shape}")
    else:
        assert where.tree is not None
        mask = np.broadcast_to(_evaluate(where.tree.body, columns, where.text), owners.shape)
    return np.flatnonzero(mask)


def narrowed(reader: Any, where: Where | None, subset: np.ndarray | None, location: str) -> np.ndarray | None:
    """``subset`` (None: every sample) less the samples ``where`` does not pass; a ConfigError
    where none is left."""
    if where is None:
        return subset
    kept = select(reader, where, location)
    if subset is not None:
        kept = np.intersect1d(subset, kept)
    if not kept.size:
        among = "" if subset is None else " among the indices given"
        raise ConfigError(f"where={where.text or 'function'!r} keeps no sample of store {location!r}{among}")
    return kept


def _evaluate(node: ast.AST, columns: dict[str, np.ndarray], text: str) -> Any:
    if isinstance(node, ast.BoolOp):
        parts = [np.asarray(_evaluate(v, columns, text), dtype=bool) for v in node.values]
        combine = np.logical_and if isinstance(node.op, ast.And) else np.logical_or
        joined = parts[0]
        for part in parts[1:]:
            joined = combine(joined, part)
        return joined
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return np.logical_not(_evaluate(node.operand, columns, text))
    assert isinstance(node, ast.Compare)  # parse_where admits nothing else
    out: Any = True
    left = node.left
    for op, right in zip(node.ops, node.comparators, strict=True):
        a, b = _operand(left, columns), _operand(right, columns)
        if isinstance(op, (ast.In, ast.NotIn)):
            found = np.isin(a, _members(b, a, text))
            result = found if isinstance(op, ast.In) else ~found
        else:
            _comparable(a, b, text)
            result = _OPS[type(op)](a, b)
        out = np.logical_and(out, result)
        left = right
    return out


def _operand(node: ast.AST, columns: dict[str, np.ndarray]) -> Any:
    if isinstance(node, ast.Name):
        return columns[node.id]
    if isinstance(node, ast.UnaryOp):  # a negative number
        return -_operand(node.operand, columns)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Call):  # file('...')
        return _FileIds(node.args[0].value)  # type: ignore[attr-defined]
    return [_operand(item, columns) for item in node.elts]  # type: ignore[attr-defined]


class _FileIds:
    def __init__(self, path: str) -> None:
        self.path = path


def _members(values: Any, field: np.ndarray, text: str) -> np.ndarray:
    """The values of an ``in``'s right side, of the field's kind."""
    strings = field.dtype.kind == "T"
    if isinstance(values, _FileIds):
        values = _read_ids(Path(values.path), text)
    if isinstance(values, np.ndarray):  # a .npy file's: of its own dtype
        if strings != (values.dtype.kind in "TUS"):
            raise ConfigError(f"where: a {'text' if strings else 'number'} field is compared with the "
                              f"{values.dtype} ids of a .npy file in {text!r}")
        return values.astype("T") if strings else values
    items = list(values)
    if strings:
        if not all(isinstance(v, str) for v in items):
            raise ConfigError(f"where: a text field is compared with numbers in {text!r}")
        return np.asarray(items, dtype="T")
    try:
        if field.dtype.kind in "iu":  # whole ids past 2**53 compared exactly, not as floats
            return np.asarray([v if isinstance(v, float) else int(v) for v in items], dtype=object).astype(
                np.int64 if all(not isinstance(v, float) for v in items) else np.float64)
        return np.asarray([float(v) for v in items], dtype=np.float64)
    except OverflowError:
        raise ConfigError(f"where: a number past int64 is compared with a whole-number field "
                          f"in {text!r}") from None
    except ValueError:
        raise ConfigError(f"where: a number field is compared with text in {text!r}") from None


def _read_ids(path: Path, text: str) -> list[str] | np.ndarray:
    """The ids in a file: one a line (blank lines skipped), or a ``.npy`` array (DataComp's
    subsets: pairs of uint64 read as the 32 hex digits of its ``uid`` field, or plain numbers or
    strings). A plain file of at most MAX_ID_FILE_BYTES, read once."""
    where = f"where: file({str(path)!r})"
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):  # a FIFO would block, /dev/zero never end
                raise ConfigError(f"{where} is not a plain file")
            if st.st_size > MAX_ID_FILE_BYTES:
                raise ConfigError(f"{where} holds {st.st_size} bytes, more than {MAX_ID_FILE_BYTES}")
            data = f.read(MAX_ID_FILE_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{where} cannot be read: {e.strerror or e}") from None
    if path.suffix.lower() == ".npy":
        try:
            ids = np.load(io.BytesIO(data), allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise ConfigError(f"{where} is not a .npy array: {one_line(e)}") from None
        if ids.dtype.names and len(ids.dtype.names) == 2 and all(
                ids.dtype[n] == np.uint64 for n in ids.dtype.names):  # DataComp: a 128-bit uid
            high, low = (ids[n].astype(np.uint64) for n in ids.dtype.names)
            return np.asarray([f"{a:016x}{b:016x}" for a, b in zip(high.tolist(), low.tolist(), strict=True)],
                              dtype="T")
        if ids.ndim != 1 or ids.dtype.kind not in "iufUS":
            raise ConfigError(f"{where} holds a {ids.dtype} array of shape {ids.shape}, not ids")
        return ids
    try:
        return [line.strip() for line in data.decode("utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not UTF-8 text (one id a line)") from None


def _comparable(a: Any, b: Any, text: str) -> None:
    def kind(v: Any) -> str:
        if isinstance(v, np.ndarray):
            return "text" if v.dtype.kind == "T" else "number"
        return "text" if isinstance(v, str) else "number"

    if kind(a) != kind(b):
        raise ConfigError(f"where: a text field is compared with a number in {text!r}")
