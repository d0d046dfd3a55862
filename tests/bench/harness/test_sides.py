"""A figure over rounds reads as its median and range, one way in every suite's table and JSON."""

from __future__ import annotations

import json
from dataclasses import asdict

from tilefeed.bench.harness.sides import Figure, figures, range_text, spread_text

ROUNDS = [3.0, 1.0, 2.5, 4.0]  # an even count: the median falls between two rounds


def test_a_figure_is_its_median_and_its_range() -> None:
    figure = Figure(ROUNDS)
    assert figure.median == 2.75 and figure.bounds == (1.0, 4.0)
    assert figure.text(".1f") == "2.8 (1.0-4.0)"  # what every "median (range)" cell shows
    assert figure.cells(".0%") == "275% | 100%-400%"  # median and range in columns of their own


def test_the_spread_is_what_json_keeps_and_reads_as_the_figure() -> None:
    spread = Figure(ROUNDS).spread()
    assert list(spread) == ["median", "min", "max"]  # the keys, in order, of the cloud and clients JSON
    kept = json.loads(json.dumps(spread))
    assert spread_text(kept, ",.2f") == Figure(ROUNDS).text(",.2f") == "2.75 (1.00-4.00)"


def test_signed_ranges_are_written_with_words_between() -> None:
    assert range_text((-1.5, 2.0), "+.1f", " to ") == "-1.5 to +2.0"
    assert spread_text({"median": 0.5, "min": -1.5, "max": 2.0}, "+.1f", " to ") == "+0.5 (-1.5 to +2.0)"
    assert range_text([10, 20], ".0f") == "10-20"  # a pair JSON gave back as a list


def test_figures_come_back_from_their_json() -> None:
    sides = {"a": Figure(ROUNDS)}
    again = figures(json.loads(json.dumps({k: asdict(f) for k, f in sides.items()})))
    assert again == sides
