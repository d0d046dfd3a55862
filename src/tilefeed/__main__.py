"""``python -m tilefeed``: the ``tilefeed`` command."""

import sys

from tilefeed.preprocess.cli import main

sys.exit(main())
