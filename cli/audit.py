"""``tilefeed audit DIR``: per epoch, the samples a Loader's ledger says were delivered once,
twice or never, across all ranks and restarts (the ledger itself is ``pipeline.audit.ledger``)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from tilefeed.cli.arguments import HelpFormatter
from tilefeed.pipeline.audit.ledger import COUNT, POPULATION, audit, format_audit


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``tilefeed audit``."""
    parser = argparse.ArgumentParser(
        prog="tilefeed audit",
        description="Report, per epoch, the samples delivered once, twice or never across all ranks "
        "and restarts, from the ledger a Loader(ledger=DIR) wrote. Exits 1 when a sample was "
        "delivered twice or never beyond what drop_last and padding explain.",
        formatter_class=HelpFormatter)
    parser.add_argument("ledger", metavar="DIR", help="the folder given to Loader(ledger=DIR)")
    parser.add_argument("--json", action="store_true",
                        help="print the results as JSON on stdout instead of text")
    return parser


def main(argv: list[str]) -> int:
    """0 when every epoch is exactly once (within what drop_last and padding explain), 1 when a
    sample was delivered twice or never, or DIR holds no ledger; 2 for a malformed command line."""
    args = build_parser().parse_args(argv)
    if not any((Path(args.ledger) / name).is_file() for name in (POPULATION, COUNT)):
        print(f"tilefeed: error: {args.ledger!r} holds no ledger (no {POPULATION} or {COUNT})",
              file=sys.stderr)
        return 1
    results = audit(args.ledger)
    print(json.dumps([asdict(r) for r in results], indent=2) if args.json else format_audit(results))
    return 0 if all(r.ok for r in results) else 1
