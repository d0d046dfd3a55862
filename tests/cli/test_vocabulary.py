"""One vocabulary across every ``tilefeed`` command: every option of every parser (built as the
command line builds them) is a name of ``VOCABULARY``, with help, showing its default at most
once; docs/cli-vocabulary.md is that table; each old spelling still works and says once, on
stderr, what to type instead."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from tilefeed.cli.arguments import RENAMED, VOCABULARY, HelpFormatter, Term, add_renamed
from tilefeed.cli.bench import FORMS, bench_main, main_parser
from tilefeed.cli.main import all_parsers
from tilefeed.store.errors import ConfigError
from tests.helpers import run_cli, write_folder

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli-vocabulary.md"


def _table(text: str, header: str) -> list[list[str]]:
    """The rows of the markdown table under ``header`` (its first line), cells stripped of `."""
    lines = text[text.index(header):].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
    return rows


def _option(action: argparse.Action, option: str) -> str:
    """The vocabulary name of one of ``action``'s option strings: ``--no-X`` of a
    BooleanOptionalAction is ``--X``'s other half."""
    if isinstance(action, argparse.BooleanOptionalAction) and option.startswith("--no-"):
        return "--" + option[len("--no-"):]
    return option


def problems(command: str, parser: argparse.ArgumentParser) -> list[str]:
    """What in ``parser`` (the parser of ``tilefeed command``) breaks the vocabulary."""
    found = []
    renamed = RENAMED.get(command, {})
    formatter = parser._get_formatter()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):  # its commands' help lines are its help
            found += [f"{command}: command {c.dest} has no help" for c in action._choices_actions if not c.help]
            continue
        if action.help == argparse.SUPPRESS:  # hidden: an old spelling, and only that
            for option in action.option_strings:
                new = renamed.get(option)
                if new is None:
                    found.append(f"{command}: hidden {option} is no old spelling of RENAMED")
                elif parser._option_string_actions[new].dest != action.dest:
                    found.append(f"{command}: {option} writes elsewhere than {new}")
            continue
        if not action.help:
            found.append(f"{command}: {'/'.join(action.option_strings) or action.dest} has no help")
        for option in action.option_strings:
            if option.startswith("--") and _option(action, option) not in VOCABULARY:
                found.append(f"{command}: {option} is outside the vocabulary")
        shown = formatter._expand_help(action) if action.help else ""
        if shown.count("(default") > 1 or "default: None" in shown:
            found.append(f"{command}: {'/'.join(action.option_strings)} shows its default twice: {shown!r}")
    for old, new in renamed.items():
        if old not in parser._option_string_actions or new not in parser._option_string_actions:
            found.append(f"{command}: RENAMED {old} -> {new}, which the parser does not take")
    return found


def test_every_parser_speaks_the_vocabulary() -> None:
    parsers = all_parsers()
    assert {"", "info", "verify", "preprocess", "doctor", "audit", "show", "demo", "bench"} <= set(parsers)
    assert {f"bench {name}" for name in FORMS} <= set(parsers)
    assert [p for command, parser in parsers.items() for p in problems(command, parser)] == []


def test_every_name_of_the_vocabulary_is_used_and_every_old_spelling_belongs_to_a_parser() -> None:
    parsers = all_parsers()
    used = {_option(a, o) for p in parsers.values() for a in p._actions if a.help != argparse.SUPPRESS
            for o in a.option_strings if o.startswith("--")}
    assert used == set(VOCABULARY)
    assert set(RENAMED) <= set(parsers)
    for pairs in RENAMED.values():
        assert all(new in VOCABULARY and old != new for old, new in pairs.items())


def test_no_concept_has_two_names() -> None:
    concepts = [term.concept for term in VOCABULARY.values()]
    assert len(concepts) == len(set(concepts))
    assert all(term.concept and term.meaning and term.units for term in VOCABULARY.values())


def test_the_doc_is_the_vocabulary() -> None:
    text = DOC.read_text()
    rows = _table(text, "| concept | option | meaning | units |")
    assert {option: Term(concept, meaning, units) for concept, option, meaning, units in rows} == VOCABULARY
    assert len(rows) == len(VOCABULARY)
    old = _table(text, "| command | old | new |")
    assert {(c.removeprefix("tilefeed ").strip(), o, n) for c, o, n in old} == {
        (command, o, n) for command, pairs in RENAMED.items() for o, n in pairs.items()}


def _bad_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--threads", type=int, default=2, help="threads")  # not a name of the vocabulary
    p.add_argument("--tile", type=int, default=256)  # no help
    p.add_argument("--size", type=int, default=224, help="output side (default: 224)")  # twice
    p.add_argument("--count", type=int, default=None, help="how many")  # "(default: None)"
    p.add_argument("--width", type=int, help=argparse.SUPPRESS)  # hidden, no old spelling
    return p


def test_the_check_finds_each_kind_of_break() -> None:
    found = "\n".join(problems("bench", _bad_parser()))
    assert "--threads is outside the vocabulary" in found
    assert "--tile has no help" in found
    assert "--size shows its default twice" in found and "--count shows its default twice" in found
    assert "hidden --width is no old spelling" in found
    # an old spelling the parser lacks: RENAMED names it, the parser does not take it
    assert "RENAMED --json -> --out, which the parser does not take" in found


def test_help_shows_a_default_once_and_none_for_flags_and_computed_defaults() -> None:
    p = argparse.ArgumentParser(formatter_class=HelpFormatter)
    p.add_argument("--a", type=int, default=3, help="a")
    p.add_argument("--b", type=int, default=None, help="b (default: computed)")
    p.add_argument("--c", action="store_true", help="c")
    p.add_argument("--d", type=int, default=0, help="d")
    p.add_argument("--e", action=argparse.BooleanOptionalAction, default=True, help="e")
    shown = {a.dest: p._get_formatter()._expand_help(a) for a in p._actions if a.dest != "help"}
    assert shown == {"a": "a (default: 3)", "b": "b (default: computed)", "c": "c", "d": "d (default: 0)",
                     "e": "e (default: True)"}


# a value each old spelling takes, and the words a parser needs before it (its positionals)
VALUES = {"--size": "32", "--workers": "3", "--warm": "5", "--timed": "7", "--json": "r.json",
          "--out": "folder", "--root": "sets"}
POSITIONALS = {"preprocess": ["SRC", "OUT"], "bench soak": ["STORE"]}
OLD = [(command, old, new) for command, pairs in RENAMED.items() for old, new in pairs.items()]


@pytest.mark.parametrize(("command", "old", "new"), OLD, ids=[f"{c or 'tilefeed'}:{o}" for c, o, _ in OLD])
def test_an_old_spelling_works_as_the_new_and_notes_it_once(command: str, old: str, new: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    before = POSITIONALS.get(command, [])
    value = VALUES[old]
    wanted = all_parsers()[command].parse_args([*before, new, value])
    assert capsys.readouterr().err == ""
    got = all_parsers()[command].parse_args([*before, old, value, old, value])  # twice: one note
    assert vars(got) == vars(wanted)
    notes = capsys.readouterr().err.splitlines()
    assert len(notes) == 1 and f"{old} is deprecated" in notes[0] and f"use {new}" in notes[0], notes


def test_old_spellings_are_hidden_from_help() -> None:
    for command, pairs in RENAMED.items():
        text = all_parsers()[command].format_help()
        for old, new in pairs.items():
            # neither in the usage line nor at the start of an option's help
            assert re.search(rf"(^  |\[){re.escape(old)}[ \]\n]", text, re.M) is None, (command, old)
            assert re.search(rf"(^  |\[){re.escape(new)}[ \]\n]", text, re.M), (command, new)


def test_add_renamed_keeps_the_new_default_and_type() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tile", type=int, default=256, help="tile side")
    RENAMED["test"] = {"--size": "--tile"}
    try:
        add_renamed(p, "test")
    finally:
        del RENAMED["test"]
    assert p.parse_args([]).tile == 256
    assert p.parse_args(["--size", "64"]).tile == 64
    with pytest.raises(SystemExit):
        p.parse_args(["--size", "big"])


def test_preprocess_run_with_the_old_spellings(tmp_path: Path) -> None:
    src = write_folder(tmp_path / "images", classes=2, per_class=2, size=(40, 30))
    r = run_cli("preprocess", str(src), str(tmp_path / "store"), "--size", "16", "--workers", "1", "--quiet")
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        "tilefeed preprocess: note: --size is deprecated and will be removed; use --tile",
        "tilefeed preprocess: note: --workers is deprecated and will be removed; use --processes"]
    info = run_cli("info", str(tmp_path / "store"), "--json")
    assert '"tile": 16' in info.stdout


def test_bench_lists_every_form_on_one_line_and_names_an_unknown_one() -> None:
    text = main_parser().format_help()
    for name, form in FORMS.items():
        assert re.search(rf"^  {re.escape(name)} +{re.escape(form.summary)}$", text, re.M), name
    with pytest.raises(ConfigError, match="unknown bench form 'nosuch'; the forms: preprocess, loader"):
        bench_main(["nosuch"])
