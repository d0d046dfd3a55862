"""``tilefeed``: parses the command line and dispatches. Each command loads what it needs when it
runs, so ``--version`` and ``--help`` load no NumPy, PIL, zarr or torch."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import tilefeed
from tilefeed.cli.arguments import HelpFormatter
from tilefeed.cli.storage_options import add_storage_option, shown
from tilefeed.store.errors import TilefeedError

EPILOG = """examples:
  tilefeed preprocess ~/data/train store/train --tile 256 --codec lz4
  tilefeed preprocess scans.csv store/scans --mode grid --tile 512 --stride 448 --codec jpeg
  tilefeed preprocess ~/data/train s3://my-bucket/stores/train --codec jpeg
  tilefeed info store/train
  tilefeed verify store/train --deep
  tilefeed show store/train --train --count 64 --out sheet.png
  tilefeed doctor
  tilefeed bench --images ~/data/train --store store/train --loaders baseline,tilefeed
"""

# the commands whose own parsers take every option after their name, with their help lines
OWN_PARSERS = {
    "preprocess": "convert images into a tiled, sharded Zarr v3 store",
    "doctor": "what this installation can do: PIL codecs, DALI, torch, GPU",
    "audit": "from a Loader's ledger: samples delivered once, twice or never",
    "show": "a contact sheet (PNG) of samples as the model receives them",
    "bench": "benchmarks (see `tilefeed bench --help`)",
    "demo": "generate images, preprocess, benchmark: the end-to-end tour",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tilefeed",
        description="Pre-tile an image dataset into sharded Zarr v3, feed it to the GPU with DALI, "
        "and measure how long training waits for data.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action=_Version, nargs=0, default=argparse.SUPPRESS,
                        help="show program's version number and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _own_parser(sub, "preprocess")

    i = sub.add_parser("info", help="describe a store: samples, classes, codec, shards, rejects",
                       formatter_class=HelpFormatter)
    i.add_argument("store", metavar="STORE", help="a tilefeed store (folder or bucket URL)")
    i.add_argument("--json", action="store_true",
                   help="print the description as JSON on stdout instead of text")
    add_storage_option(i)

    v = sub.add_parser("verify", help="check every file of a store: arrays, digests, shard "
                       "indexes and tile checksums",
                       description="Exit 0 when the store is sound; otherwise print each problem, "
                       "naming the shard file and sample, and exit 1.", formatter_class=HelpFormatter)
    v.add_argument("store", metavar="STORE", help="a tilefeed store (folder or bucket URL)")
    v.add_argument("--deep", action="store_true", help="also decode every tile")
    v.add_argument("--quiet", action="store_true", help="no progress bar")
    add_storage_option(v)

    for name in ("doctor", "audit", "show", "bench", "demo"):
        _own_parser(sub, name)
    return parser


class _Version(argparse.Action):
    """``--version``, looked up only when asked for (``--help`` has no use for it)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(f"tilefeed {tilefeed.__version__}")
        parser.exit()


def _own_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str) -> None:
    """``name`` listed with its help line; ``parse`` hands what follows it to its own parser."""
    sub.add_parser(name, help=OWN_PARSERS[name], add_help=False).add_argument(
        "args", nargs=argparse.REMAINDER)


def all_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of every command and ``tilefeed bench`` form, built as the command line
    builds them, by the words typed after ``tilefeed`` (``"bench"`` alone: the main form)."""
    from tilefeed.cli.audit import build_parser as audit_parser
    from tilefeed.cli.bench import FORMS, main_parser
    from tilefeed.cli.demo import build_parser as demo_parser
    from tilefeed.cli.doctor import build_parser as doctor_parser
    from tilefeed.cli.preprocess_command import build_parser as preprocess_parser
    from tilefeed.cli.show import build_parser as show_parser

    top = build_parser()
    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices
    parsers = {"": top, "info": commands["info"], "verify": commands["verify"],
               "preprocess": preprocess_parser(), "doctor": doctor_parser(), "audit": audit_parser(),
               "show": show_parser(), "demo": demo_parser(), "bench": main_parser()}
    parsers.update({f"bench {name}": form.parser() for name, form in FORMS.items()})
    return parsers


def parse(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    if argv and argv[0] == "preprocess":
        from tilefeed.cli.preprocess_command import build_parser as preprocess_parser

        return preprocess_parser().parse_args(argv[1:], argparse.Namespace(command="preprocess"))
    if argv and argv[0] in OWN_PARSERS:
        return argparse.Namespace(command=argv[0], args=argv[1:])
    return build_parser().parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        return _run(args)
    except TilefeedError as e:
        print(f"tilefeed: error: {shown(str(e), args)}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `tilefeed info | head`: the reader left; say nothing more, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print("tilefeed: interrupted (rerun the same command to resume)", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    if args.command == "preprocess":
        from tilefeed.cli.preprocess_command import run

        return run(args)
    if args.command in ("info", "verify"):
        from tilefeed.cli.store_commands import info_command, verify_command

        return info_command(args) if args.command == "info" else verify_command(args)
    if args.command == "doctor":
        from tilefeed.cli.doctor import main as doctor_main

        return doctor_main(args.args)
    if args.command == "audit":
        from tilefeed.cli.audit import main as audit_main

        return audit_main(args.args)
    if args.command == "show":  # prints its own one-line errors
        from tilefeed.cli.show import main as show_main

        return show_main(args.args)
    if args.command == "bench":
        from tilefeed.cli.bench import bench_main

        return bench_main(args.args)
    from tilefeed.cli.demo import demo_main

    return demo_main(args.args)


if __name__ == "__main__":
    sys.exit(main())
