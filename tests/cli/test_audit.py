"""``tilefeed audit``: the command over a Loader's ledger."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.helpers import make_store, run_cli
from tilefeed.pipeline import Loader


def test_a_folder_without_a_ledger_is_one_line_on_stderr(tmp_path: Path) -> None:
    r = run_cli("audit", str(tmp_path))
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("tilefeed: error: ")
    assert "holds no ledger" in r.stderr


def test_the_json_is_one_record_per_epoch(tmp_path: Path) -> None:
    store = make_store(tmp_path, "lz4")
    with Loader(store, 8, ledger=tmp_path / "ledger", dtype=torch.uint8, layout="NHWC", device="cpu") as loader:
        list(loader)
    r = run_cli("audit", str(tmp_path / "ledger"), "--json")
    assert r.returncode == 0, r.stderr
    records = json.loads(r.stdout)
    assert [(e["epoch"], e["once"], e["never"], e["ok"]) for e in records] == [(0, 50, 0, True)]
