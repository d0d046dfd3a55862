"""The command-line argument types the commands share (cli/arguments.py)."""

from __future__ import annotations

import argparse

import pytest

from tilefeed.cli.arguments import positive


def test_positive_takes_whole_numbers_from_one() -> None:
    assert positive("1") == 1 and positive(" 42 ") == 42
    for text, said in [("0", "expected a number >= 1, got 0"), ("-3", "expected a number >= 1, got -3"),
                       ("2.5", "expected a whole number, got '2.5'"),
                       ("x", "expected a whole number, got 'x'")]:
        with pytest.raises(argparse.ArgumentTypeError, match=f"^{said}$"):
            positive(text)


def test_positive_speaks_through_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="p")
    parser.add_argument("--count", type=positive)
    assert parser.parse_args(["--count", "3"]).count == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["--count", "0"])
    assert "argument --count: expected a number >= 1, got 0" in capsys.readouterr().err
