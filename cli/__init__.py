"""The ``tilefeed`` command, on top of everything: ``tilefeed.cli.main`` parses, and each
command loads what it needs when it runs, so ``--version`` and ``--help`` load nothing heavy."""

from __future__ import annotations

if __name__ != "tilefeed.cli":  # the repository's folder imported as itself, from a checkout's root
    raise ImportError(f"import tilefeed.cli, not {__name__}: the same module under two names would be "
                      "two modules (two graph pools, two caches)")
