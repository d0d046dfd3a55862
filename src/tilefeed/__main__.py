"""``python -m tilefeed``: the ``tilefeed`` command."""

import sys

from tilefeed.cli.main import main

sys.exit(main())
