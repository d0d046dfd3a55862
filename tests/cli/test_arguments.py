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


def test_the_list_types_take_what_they_say() -> None:
    from tilefeed.cli.arguments import decimal_list, number_list, positive_list

    assert number_list("3, -1") == [3, -1] and positive_list("128,160") == [128, 160]
    assert decimal_list("0,12.5") == [0.0, 12.5]
    for parse, text in [(positive_list, "0,4"), (positive_list, "128,x"), (number_list, ""),
                        (decimal_list, "1,a")]:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


@pytest.mark.parametrize("argv", [["loader", "--sizes", "128,x"], ["scale", "--classes", "0,4"],
                                  ["sweep", "--values", "1,a"], ["loader", "--batch-size", "-1"],
                                  ["preprocess", "--count", "0"]])
def test_a_bench_form_refuses_a_bad_number_before_any_work(argv: list[str]) -> None:
    from tests.helpers import run_cli

    r = run_cli("bench", *argv)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"tilefeed bench {argv[0]}: error: argument {argv[1]}")
    assert "images:" not in r.stdout  # refused before a set of images was made
