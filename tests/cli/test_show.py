"""``tilefeed show``: the command writes the sheet, lists the rejects, and fails as every
tilefeed command does (2 for a malformed command line, 1 with one line for what cannot be used)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tilefeed.cli.show import main
from tilefeed.pipeline.sheet import Sheet
from tilefeed.store.inspection import info

def test_cli_writes_the_training_sheet_in_a_square_grid(pad_store: tuple[Path, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str],
                                                        train_sheet: Sheet) -> None:
    out = tmp_path / "sheet.png"
    assert main([str(pad_store[1]), "--train", "--count", "16", "--out", str(out)]) == 0
    said = capsys.readouterr().out.strip().splitlines()
    assert said == [f"wrote {out}: 16 training crops of epoch 0, seed 0, 32 px"]
    with Image.open(out) as png:
        written = np.asarray(png.convert("RGB"))
    np.testing.assert_array_equal(written, np.asarray(train_sheet.image))  # the same crops, drawn alike
    assert len(train_sheet.cells) == 16
    xs, ys = sorted({x for x, _ in train_sheet.cells}), sorted({y for _, y in train_sheet.cells})
    assert len(xs) == 4 and len(ys) == 4  # ceil(sqrt(16)) columns
    assert train_sheet.side == 96 and train_sheet.scale == 3  # 32 px tiles enlarged to at least 96
    height, width = written.shape[:2]
    assert xs[-1] + train_sheet.side <= width < xs[-1] + 2 * train_sheet.side
    assert ys[-1] + train_sheet.side < height  # a caption strip under the last row


def test_rejects_are_listed_with_their_reasons(pad_store: tuple[Path, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    src, store = pad_store
    rejects = {r["path"]: r["reason"] for r in info(store).rejects}
    cut, words = str(src / "wide" / "cut.jpg"), str(src / "tall" / "words.jpg")
    assert set(rejects) == {cut, words}
    out = tmp_path / "rejects.png"
    assert main([str(store), "--rejects", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert f"rejected   {cut}: {rejects[cut]}" in lines  # partly decodes: drawn
    assert any(line.startswith(f"rejected   {words}: {rejects[words]}  (not drawn: ") for line in lines)
    assert lines[-1] == f"wrote {out}: 1 of 2 rejected inputs"
    with Image.open(out) as png:
        assert png.width >= 128 and png.height > 128  # one thumbnail and its caption


@pytest.mark.parametrize("args", [
    ["{store}", "--count", "0"],
    ["{store}", "--samples", "1,x"],
    ["{store}", "--train", "--eval"],
    ["{store}", "--count", "3", "--samples", "1"],
    ["{store}", "--bogus"],
])
def test_a_malformed_command_line_exits_2_as_every_command(pad_store: tuple[Path, Path], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str],
                                                           args: list[str]) -> None:
    names = {"store": str(pad_store[1])}
    with pytest.raises(SystemExit) as exit_:
        main([a.format(**names) for a in args])
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip().splitlines()[-1].startswith("tilefeed show: error: ")
    assert not list(tmp_path.glob("*.png"))


@pytest.mark.parametrize("args", [
    ["{missing}"],
    ["{store}", "--samples", "1,99"],
    ["{store}", "--samples", "1,1"],
    ["{store}", "--stored", "--size", "40"],
    ["{store}", "--out", "{missing}/sheet.png"],
])
def test_what_cannot_be_used_is_one_line_and_exits_1(pad_store: tuple[Path, Path], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     args: list[str]) -> None:
    names = {"store": str(pad_store[1]), "missing": str(tmp_path / "missing")}
    assert main([a.format(**names) for a in args]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tilefeed: error: ")
    assert not list(tmp_path.glob("*.png"))


def test_a_bad_store_is_one_line_in_a_real_process_with_the_clis_status(tmp_path: Path) -> None:
    (tmp_path / "zarr.json").write_text("{not json")
    for command in (["show", str(tmp_path)], ["info", str(tmp_path)]):  # the same status as info's
        done = subprocess.run([sys.executable, "-m", "tilefeed", *command], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)
        assert done.returncode == 1, (command, done.stderr)
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("tilefeed: error: ")
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "show.png").exists()
