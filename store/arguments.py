"""Command-line argument types that commands of more than one layer parse with (``tilefeed
preprocess`` in cli/, ``tilefeed show`` in pipeline/): kept here, in the layer both stand on.
Imports nothing but argparse, so a parser built with them loads no numpy, zarr or image library.
"""

from __future__ import annotations

import argparse


def positive(text: str) -> int:
    """An argparse ``type``: ``text`` as a whole number >= 1.

    Parameters
    ----------
    text : str
        The argument as given on the command line.

    Returns
    -------
    int
        The number.

    Raises
    ------
    argparse.ArgumentTypeError
        When ``text`` is not a whole number, or is below 1; argparse shows the message.
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value
