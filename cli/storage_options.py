"""The ``--storage-option KEY=VALUE`` argument of the commands that open a store, and the rule
for what they print: one line, with no credential in it."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def add_storage_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="for a store URL: a setting added to the cloud's standard configuration "
                   "(environment, profiles), e.g. endpoint=http://minio:9000, region=eu-west-1, "
                   "profile=NAME, timeout=60s, max_retries=10; repeat for more")


def storage_options(args: argparse.Namespace) -> dict[str, str]:
    """The ``--storage-option`` values as a dict (a malformed one is a ConfigError)."""
    return parse_options(args.storage_option)


def parse_options(pairs: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings (``--storage-option``) as a dict."""
    from tilefeed.store.errors import ConfigError

    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--storage-option takes KEY=VALUE, got {pair.split('=')[0]!r}...")
        options[key.strip().lower()] = value
    return options


def shown(text: str, args: argparse.Namespace | None = None) -> str:
    """``text`` as one printable line with no credential in it (those of the environment, of
    any URL, and of the ``--storage-option`` values)."""
    from tilefeed.store.inspection import printable
    from tilefeed.store.storage import redact

    options: dict[str, str] = {}
    for pair in getattr(args, "storage_option", None) or []:  # leniently: any value is hidden
        key, _, value = str(pair).partition("=")
        options[key.strip().lower()] = value
    return printable(redact(str(text), options))
