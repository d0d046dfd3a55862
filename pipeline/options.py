"""The words the Loader's options are made of, below every room that reads them.

The enums a Loader option takes (``Layout``, ``Shuffle``, ``Targets``, ``TargetsLayout``), the
captions a batch carries (``TextChoice``, from ``text``), the
ImageNet normalisation its ``mean`` and ``std`` default to, and the DataLoader options it has no
use for (``DATALOADER_ONLY``). They live on the bottom floor of ``pipeline/`` so that the order,
the recipe, the targets, the engine and the settings all speak the same members, parsed once
where the caller's value comes in (``store.choices.choice``).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from tilefeed.store.choices import choice
from tilefeed.store.errors import ConfigError
from tilefeed.store.format import PAIR_NAME

IMAGENET_MEAN: Final = (0.485 * 255, 0.456 * 255, 0.406 * 255)  # 0..255 units, as the graph applies them
IMAGENET_STD: Final = (0.229 * 255, 0.224 * 255, 0.225 * 255)


class Layout(StrEnum):
    """How a batch's images are laid out (the Loader's ``layout``); a member equals its string.

    ``NCHW``: channels first, transposed in the graph. ``NHWC``: channels last, as decoded.
    ``CHANNELS_LAST``: NCHW shape over NHWC memory (torch.channels_last), with no transpose.
    """

    NCHW = "NCHW"
    NHWC = "NHWC"
    CHANNELS_LAST = "channels_last"

    @property
    def memory(self) -> Layout:
        """The order of the bytes: ``NCHW``, or ``NHWC`` (of ``NHWC`` and ``CHANNELS_LAST`` alike)."""
        return Layout.NCHW if self is Layout.NCHW else Layout.NHWC


class Shuffle(StrEnum):
    """How an epoch orders its samples (``EpochOrder``); a member equals its string, so
    ``Shuffle.SHARD == "shard"``, and ``.value`` is the plain string a saved state holds."""

    GLOBAL = "global"
    SHARD = "shard"
    NONE = "none"


class Targets(StrEnum):
    """What a batch carries besides the images; a member equals its string.

    ``BOXES``: each image's boxes, category ids and crowd flags. ``MASKS``: a semantic store's
    class-id masks, or with ``BOXES`` an instance store's per-object masks.
    """

    BOXES = "boxes"
    MASKS = "masks"


class TargetsLayout(StrEnum):
    """How a batch's boxes are laid out: torchvision's list of per-image dicts, or padded tensors."""

    DICTS = "dicts"
    PADDED = "padded"


def parse_targets(value: str | Targets | Iterable[str | Targets] | None) -> frozenset[Targets]:
    """The ``Targets`` a ``targets=`` value names: one name, several, or None (none).

    Parameters
    ----------
    value : str, Targets, iterable of them, or None
        e.g. ``"boxes"``, ``("boxes", "masks")``.

    Returns
    -------
    frozenset of Targets
        What a batch holds.
    """
    if value is None:
        return frozenset()
    names = [value] if isinstance(value, str) else list(value)
    return frozenset(choice(Targets, name, "targets") for name in names)


# DataLoader's options that mean nothing to a Loader, and why. Given to ``Loader(...)``, each
# passes with one warning (so a swapped script runs); read from a Loader, the ones it has no
# attribute for fail with this reason (an AttributeError, so ``hasattr`` answers as for any object
# without them). ``sampler`` and ``batch_sampler`` are read from the Loader's own faces.
DATALOADER_ONLY: Final = {
    "collate_fn": "batches are assembled in the Loader's DALI graph, not collated",
    "sampler": "the Loader orders its own samples from (seed, epoch, sample): shuffle= and indices= "
               "choose the order and the samples",
    "batch_sampler": "the Loader batches its own order: batch_size= and drop_last= shape it",
    "worker_init_fn": "the Loader's workers are threads it starts itself",
    "generator": "order and augmentation come from (seed, epoch, sample), not a torch Generator",
    "timeout": "the Loader has no worker processes to time out",
    "multiprocessing_context": "the Loader's workers are threads, not processes",
}


@dataclass(frozen=True)
class TextChoice:
    """Which captions a batch carries: one name; several in a fixed order of priority (the first
    that is not empty); or several with weights (a weighted order per sample, drawn).

    Attributes
    ----------
    names : tuple of str
        The caption names, in the order given.
    weights : tuple of float or None
        Their weights, >= 0 with one > 0 (a weight of 0: a fallback after the others, in the
        order given); None: the names' own order, no draw.
    """

    names: tuple[str, ...]
    weights: tuple[float, ...] | None = None

    def identity(self) -> list[Any]:
        """What a saved state names: the names and weights."""
        return [list(self.names), None if self.weights is None else list(self.weights)]


def parse_text(value: Any) -> TextChoice | None:
    """``Loader(text=...)``: None, a caption name, a list of names in priority order, or a
    mapping of names to weights (open_clip's ``--json-text-key`` and ``--json-text-key-probs``)."""
    if value is None:
        return None
    weighted = isinstance(value, Mapping)
    names = ([value] if isinstance(value, str)
             else list(value) if isinstance(value, (Mapping, list, tuple)) else None)
    if not names:
        raise ConfigError(f"text must be a caption name, a list of them or a dict of names to weights, "
                          f"got {value!r}")
    for name in names:
        if not isinstance(name, str) or not PAIR_NAME.fullmatch(name):
            raise ConfigError(f"text names a caption by its store name (letters, digits and _), got {name!r}")
    if len(set(names)) != len(names):
        raise ConfigError(f"text names a caption twice: {names}")
    if not weighted:
        return TextChoice(tuple(names))
    weights = list(value.values())
    for name, weight in zip(names, weights, strict=True):
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < float("inf"):
            raise ConfigError(f"text's weight for {name!r} must be a number >= 0, got {weight!r}")
    if not any(w > 0 for w in weights):
        raise ConfigError(f"text's weights must hold one above 0, got {dict(value)!r}")
    return TextChoice(tuple(names), tuple(float(w) for w in weights))


def parse_fields(value: Any) -> tuple[str, ...]:
    """``Loader(fields=...)``: field names (a single name, or a sequence of them)."""
    if value is None:
        return ()
    names = (value,) if isinstance(value, str) else tuple(value)
    for name in names:
        if not isinstance(name, str) or not PAIR_NAME.fullmatch(name):
            raise ConfigError(f"fields names store fields (letters, digits and _), got {name!r}")
    if len(set(names)) != len(names):
        raise ConfigError(f"fields names a field twice: {list(names)}")
    return names


def parse_tokenizer(value: Any) -> Callable[[list[str]], Any] | None:
    """``Loader(tokenizer=...)``: None or a callable from a list of str to a tensor."""
    if value is not None and not callable(value):
        raise ConfigError(f"tokenizer must be a callable from a list of str to a tensor, "
                          f"got {type(value).__name__}")
    return value  # type: ignore[no-any-return]


# what ``where=`` may say: comparisons of fields with values, joined by and/or/not
_COMPARE: Final = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn)
MAX_WHERE_CHARS: Final = 10_000


@dataclass(frozen=True, eq=False)  # eq=False: a callable may be the test
class Where:
    """Which samples a Loader reads, decided once when it opens from their metadata fields
    (``Loader(where=...)``): an expression (``text``, parsed and checked here; ``tree`` its
    syntax) or a callable (``test``) from a dict of field arrays to a boolean array.

    Attributes
    ----------
    text : str
        The expression as given ('' for a callable).
    tree : ast.Expression or None
        Its syntax, checked to hold only what the expression language allows.
    test : callable or None
        The callable given.
    names : tuple of str
        The fields the expression reads (every field of the store for a callable).
    """

    text: str = ""
    tree: ast.Expression | None = None
    test: Callable[[Mapping[str, Any]], Any] | None = None
    names: tuple[str, ...] = ()


def parse_where(value: Any) -> Where | None:
    """``Loader(where=...)``: None, a callable, or an expression of the language the image-text
    page documents: ``field OP value`` with OP one of ``== != < <= > >=``, ``field in [v, ...]``
    or ``field in file('ids.txt')`` (``not in`` too), chained comparisons, joined by ``and``,
    ``or``, ``not`` and parentheses. Anything else is refused in one line naming it."""
    if value is None:
        return None
    if callable(value):
        return Where(test=value)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"where must be an expression (str) or a callable over the fields, got {value!r}")
    if len(value) > MAX_WHERE_CHARS:
        raise ConfigError(f"where's expression is longer than {MAX_WHERE_CHARS} characters")
    try:
        tree = ast.parse(value.strip(), mode="eval")
        names: list[str] = []
        _check_where(tree.body, names, value)
    except SyntaxError as e:
        raise ConfigError(f"where: {e.msg} in {value[:200]!r}") from None
    except (RecursionError, MemoryError):  # parentheses or not's nested past what Python parses
        raise ConfigError("where's expression nests too deeply") from None
    return Where(text=value, tree=tree, names=tuple(dict.fromkeys(names)))


def _check_where(node: ast.AST, names: list[str], text: str) -> None:
    def refuse(what: str) -> ConfigError:
        return ConfigError(f"where: {what} is not part of the expression language (comparisons of "
                           f"fields with values, in [...] or in file('...'), and/or/not), in {text!r}")

    if isinstance(node, ast.BoolOp):
        for value in node.values:
            _check_where(value, names, text)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        _check_where(node.operand, names, text)
    elif isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        for op, right in zip(node.ops, node.comparators, strict=True):
            if not isinstance(op, _COMPARE):
                raise refuse(type(op).__name__)
            if isinstance(op, (ast.In, ast.NotIn)) and not _is_members(right):
                raise refuse("'in' something other than a list or file('...')")
        if not any(isinstance(side, ast.Name) for side in sides):
            raise refuse("a comparison of no field")
        for side in sides:
            if isinstance(side, ast.Name):
                if not PAIR_NAME.fullmatch(side.id):
                    raise refuse(f"the name {side.id!r}")
                names.append(side.id)
            elif not (_is_value(side) or _is_members(side)):
                raise refuse(ast.unparse(side))
    else:
        raise refuse(ast.unparse(node) if isinstance(node, ast.expr) else type(node).__name__)


def _is_value(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):  # a negative number
        node = node.operand
        return isinstance(node, ast.Constant) and type(node.value) in (int, float)
    return isinstance(node, ast.Constant) and type(node.value) in (int, float, str)


def _is_members(node: ast.AST) -> bool:
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(_is_value(item) for item in node.elts)
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "file"
            and len(node.args) == 1 and not node.keywords and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str))
