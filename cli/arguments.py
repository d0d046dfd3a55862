"""Argument types the commands share: each turns a command-line word into a value or says, in
one line, what it expected."""

from __future__ import annotations

import argparse


def whole_number(text: str) -> int:
    """A number >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def positive(text: str) -> int:
    """A number >= 1."""
    value = whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def number_list(text: str) -> list[int]:
    """Comma-separated whole numbers, at least one: ``i,j,k``."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers i,j,k, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values
