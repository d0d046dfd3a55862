"""Docs that cannot drift: the README stays short, the CLI page is what the parsers print, and every
fenced code block of README.md and docs/*.md runs as written.

``python`` blocks run as a script, each in a fresh folder of its own in a new process. ``sh`` and
``bash`` blocks run their commands that start with ``tilefeed`` or ``python`` (others, such as
``make``, ``pip`` or ``export``, are left out), in order, in a fresh folder, stopping at the first
that fails. Every folder starts with the small data the pages name: ``images/train`` and
``images/val`` (class folders of generated JPEGs) and the stores ``tilefeed preprocess`` makes of
them, ``stores/train`` and ``stores/val``; a local S3 server holds the bucket ``datasets`` with
``s3://datasets/stores/train`` made the way docs/object-storage.md makes it, and the environment
points at that server. ``text`` blocks are output, ``diff`` blocks patches: neither is code.

A block is left out only with an HTML comment on the line before its fence, for one of two
reasons: ``<!-- not run: needs a GPU -->`` or ``<!-- not run: needs a cluster -->``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import s3_environment, write_folder

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_LINES = 200
REASONS = ("needs a GPU", "needs a cluster")
RUN = ("python", "sh", "bash")
# each block's own limit; the whole test stays near a minute on 2 cores
BLOCK_TIMEOUT = 180
SOURCES = ("images/train", "images/val")
BUCKET_STORE = ("s3://datasets/stores/train", "--codec", "jpeg", "--shard-size", "256")


@dataclass(frozen=True)
class Block:
    """A fenced code block: where it is, its language, its text, and its ``not run`` reason."""

    page: str
    line: int
    lang: str
    code: str
    skip: str | None

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


MARK = re.compile(r"^<!--\s*not run:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


def blocks(text: str, page: str) -> list[Block]:
    """Every fenced block of a Markdown ``text``; ``skip`` is the reason in a ``not run`` comment
    on the line just before the fence (whatever it says: ``bad_marks`` judges it)."""
    found: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        indent, lang = opened.groups()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        mark = MARK.match(lines[i - 1].strip()) if i > 0 else None
        found.append(Block(page, i + 1, lang, "\n".join(body) + "\n", mark.group(1) if mark else None))
        i = j + 1
    return found


def bad_marks(found: list[Block]) -> list[str]:
    """The blocks left out for a reason other than the two allowed ones."""
    return [f"{b.name}: {b.skip!r}" for b in found if b.skip is not None and b.skip not in REASONS]


def commands(code: str) -> list[str]:
    """The commands of a shell block that the test runs: those starting with ``tilefeed`` or
    ``python`` (continuation lines joined)."""
    joined = re.sub(r"\s*\\\n\s*", " ", code)
    return [line.strip() for line in joined.splitlines()
            if re.match(r"(tilefeed|python3?)\b", line.strip())]


def all_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks(page.read_text(), str(page.relative_to(ROOT)))]


def runnable() -> list[Block]:
    return [b for b in all_blocks() if b.lang in RUN and b.skip is None
            and (b.lang == "python" or commands(b.code))]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """(a folder with the images and stores the pages use, the environment blocks run in)."""
    template = tmp_path_factory.mktemp("template")
    cache = tmp_path_factory.mktemp("cache")
    write_folder(template / "images" / "train", classes=2, per_class=8, size=(80, 60))
    write_folder(template / "images" / "val", classes=2, per_class=4, size=(80, 60), seed=1)
    with s3_environment(cache, buckets=("datasets",)) as s3:
        env = {**os.environ, **s3, "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
        for part in ("train", "val"):
            run([sys.executable, "-m", "tilefeed", "preprocess", f"images/{part}", f"stores/{part}", "--quiet"],
                template, env)
        run([sys.executable, "-m", "tilefeed", "preprocess", "images/train", *BUCKET_STORE, "--quiet"],
            template, env)
        yield template, env


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> None:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_LINES, f"README.md has {lines} lines; at most {README_LINES}: move the rest to docs/"


def test_the_cli_page_is_what_the_parsers_print() -> None:
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "tools" / "cli_reference.py")
    assert spec and spec.loader
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert (ROOT / "docs" / "cli.md").read_text() == tool.render(), \
        "docs/cli.md differs from the parsers: run python tools/cli_reference.py"


def test_blocks_are_left_out_only_for_a_gpu_or_a_cluster() -> None:
    assert not bad_marks(all_blocks())


def test_the_extraction_finds_marks_commands_and_wrong_reasons() -> None:
    page = ("text\n\n```python\nprint(1)\n```\n\n<!-- not run: needs a GPU -->\n```sh\ntilefeed x\n```\n\n"
            "<!-- not run: too slow -->\n```bash\nmake demo\npython -c 1 \\\n  --flag\n```\n\n"
            "```text\nout\n```\n")
    found = blocks(page, "p.md")
    assert [(b.lang, b.skip, b.line) for b in found] == [
        ("python", None, 3), ("sh", "needs a GPU", 8), ("bash", "too slow", 13), ("text", None, 19)]
    assert bad_marks(found) == ["p.md:13: 'too slow'"]
    assert commands(found[2].code) == ["python -c 1 --flag"]
    assert commands("make demo\n# tilefeed in a comment\n  tilefeed info s\n") == ["tilefeed info s"]


def run_block(block: Block, folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run one block in ``folder`` as the module docstring says."""
    if block.lang == "python":
        (folder / "block.py").write_text(block.code)
        argv = [sys.executable, "block.py"]
    else:
        prelude = (f'tilefeed() {{ "{sys.executable}" -m tilefeed "$@"; }}\n'
                   f'python() {{ "{sys.executable}" "$@"; }}\npython3() {{ python "$@"; }}\nset -e\n')
        (folder / "block.sh").write_text(prelude + "\n".join(commands(block.code)) + "\n")
        argv = ["bash", "block.sh"]
    return subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT)


def test_a_failing_block_fails(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    def status(lang: str, code: str) -> int:
        return run_block(Block("p.md", 1, lang, code, None), tmp_path, env).returncode

    assert status("python", "raise SystemExit(3)\n") == 3
    assert status("sh", "tilefeed info nowhere\nmake x\n") != 0
    assert status("sh", "make x\ntilefeed --version\n") == 0


@pytest.mark.parametrize("block", runnable(), ids=lambda b: b.name)
def test_the_block_runs(block: Block, sandbox: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    template, env = sandbox
    folder = tmp_path / "run"
    shutil.copytree(template, folder, symlinks=True)
    done = run_block(block, folder, env)
    assert done.returncode == 0, \
        f"{block.name} ({block.lang}) failed:\n{block.code}\n{done.stdout}\n{done.stderr}"
