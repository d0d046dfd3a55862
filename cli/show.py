"""``tilefeed show``: a contact sheet (PNG) of samples as the model receives them, drawn by
``pipeline.sheet``; on a store with captions, each sample's first caption under it.

Exit status as every tilefeed command: 0 when done, 2 for a malformed command line (argparse's
usage and error), 1 with one line on stderr for a store or an option value that cannot be used,
or a PNG that cannot be written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tilefeed.cli.arguments import HelpFormatter, number_list, positive, whole_number
from tilefeed.cli.storage_options import add_storage_option, shown, storage_options
from tilefeed.pipeline.sheet import DEFAULT_COUNT, Sheet, contact_sheet, reject_sheet
from tilefeed.store.errors import ConfigError, StoreWriteError, TilefeedError
from tilefeed.store.inspection import printable

PROG = "tilefeed show"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Write a contact sheet (PNG) of samples as the model receives them: the "
        "Loader's own crops, flips and framing on the CPU, normalisation undone, each tile "
        "captioned with its class, sample index and source file.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("store", metavar="STORE", help="a tilefeed store (folder or bucket URL)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--train", dest="train", action="store_true",
                      help="training crops and flips (Loader(train=True)), in the shuffled order")
    mode.add_argument("--eval", dest="train", action="store_false",
                      help="evaluation framing, in store order (default)")
    p.add_argument("--epoch", type=whole_number, default=0, help="epoch whose order and crops are shown")
    p.add_argument("--seed", type=whole_number, default=0, help="the Loader's seed")
    p.add_argument("--size", type=positive, default=None,
                   help="output side in pixels (default: the tile side); small sides are enlarged on "
                   "the sheet")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--count", type=positive, default=None,
                      help=f"show the first N samples of the epoch's order (default: {DEFAULT_COUNT})")
    what.add_argument("--samples", type=number_list, default=None, metavar="I,J,K",
                      help="show these samples, in this order")
    p.add_argument("--out", default="show.png", metavar="FILE", help="the PNG to write")
    view = p.add_mutually_exclusive_group()
    view.add_argument("--stored", action="store_true",
                      help="the tiles as written, with each picture's box drawn on stores with "
                      "padding (--fit pad)")
    view.add_argument("--rejects", action="store_true",
                      help="list the rejected inputs with their reasons, and draw those whose "
                      "files still (partly) decode")
    add_storage_option(p)
    p.set_defaults(train=False)
    return p


def _output(path: str) -> Path:
    """The PNG's path, refused before any work when it cannot be written there."""
    out = Path(path)
    if out.is_dir():
        raise ConfigError(f"--out {path!r} is a folder: name the PNG file to write")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {path!r}: the folder {str(out.parent)!r} does not exist")
    return out


def _describe(args: argparse.Namespace, shown: int, side: int) -> str:
    if args.stored:
        return f"{shown} stored tiles, {side} px"
    if args.train:
        return f"{shown} training crops of epoch {args.epoch}, seed {args.seed}, {side} px"
    return f"{shown} evaluation framings, {side} px"


def _show_samples(args: argparse.Namespace, out: Path, options: dict[str, str]) -> int:
    from tilefeed.pipeline.reading.reader import StoreReader

    if args.stored and args.size is not None:
        raise ConfigError("--size sets the Loader's output side; --stored shows tiles at their stored side")
    with StoreReader(args.store, storage_options=options or None) as reader:
        sheet = contact_sheet(reader, train=args.train, epoch=args.epoch, seed=args.seed,
                              size=args.size, count=args.count, samples=args.samples,
                              show_stored=args.stored)
        boxes = args.stored and reader.padded
    _save(sheet, out)
    side = sheet.side // sheet.scale
    print(f"wrote {printable(str(out))}: {_describe(args, len(sheet.cells), side)}"
          + (", picture boxes drawn" if boxes else "")
          + (f", captions {sheet.text!r} drawn" if sheet.text else ""))
    return 0


def _show_rejects(args: argparse.Namespace, out: Path, options: dict[str, str]) -> int:
    from tilefeed.store.inspection import info

    rejects = [(r["path"], r["reason"]) for r in info(args.store, options or None).rejects]
    if not rejects:
        print(f"{printable(args.store)}: no input was rejected")
        return 0
    sheet, lines = reject_sheet(rejects)
    print("\n".join(lines))
    if sheet is None:
        print(f"no sheet written: none of the {len(rejects)} rejected inputs could be drawn")
        return 0
    _save(sheet, out)
    print(f"wrote {printable(str(out))}: {len(sheet.cells)} of {len(rejects)} rejected inputs")
    return 0


def _save(sheet: Sheet, out: Path) -> None:
    try:
        sheet.image.save(out, format="PNG")
    except OSError as e:  # a full disk, a permission: the machine's problem, not an option's
        raise StoreWriteError(f"cannot write {out}: {e.strerror or e}") from None


def main(argv: Sequence[str]) -> int:
    """``tilefeed show ARGS``: 0 when done; 2 for a malformed command line; 1, with one line on
    stderr and no credential in it, for a store, an option value or a PNG that cannot be used."""
    args = build_parser().parse_args(list(argv))
    try:
        out = _output(args.out)
        options = storage_options(args)
        return _show_rejects(args, out, options) if args.rejects else _show_samples(args, out, options)
    except (TilefeedError, OSError) as e:  # a vanished file, a permission: one line too
        print(f"tilefeed: error: {shown(str(e), args)}", file=sys.stderr)
        return 1
