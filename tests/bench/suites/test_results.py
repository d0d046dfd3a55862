"""Every suite's result is a dataclass whose ``as_dict()`` holds the keys, in order, of the dict the
suite returned before (what ``--json`` wrote, so JSON written earlier reads alike) and whose
``table()`` renders from it. Small hand-made figures: the measurements have their own tests."""

from __future__ import annotations

import json
from typing import Any

import pytest

SPREAD = {"median": 2.0, "min": 1.0, "max": 3.0}


def _json_round_trip(result: Any) -> dict[str, Any]:
    """``as_dict()`` as the JSON file holds it; the table must render too."""
    assert result.table().strip()
    doc: dict[str, Any] = json.loads(json.dumps(result.as_dict()))
    return doc


def test_clients_result_keeps_the_keys_of_its_dict() -> None:
    from tilefeed.bench.suites.clients import ClientsResult

    result = ClientsResult(shard_mb=16, tiles=64, tile_kb=20, rounds=5,
                           mb_per_s={"obstore": {"whole": SPREAD, "ranged": SPREAD}})
    doc = _json_round_trip(result)
    assert list(doc) == ["shard_mb", "tiles", "tile_kb", "rounds", "mb_per_s"]
    assert doc["mb_per_s"]["obstore"]["whole"] == SPREAD
    assert "| obstore | 2 (1-3) | 2.0 (1.0-3.0) |" in result.table()


def test_cloud_result_keeps_the_keys_of_its_dict() -> None:
    from tilefeed.bench.suites.cloud import FIGURES, CloudResult

    figures: dict[str, dict[str, Any]] = {}
    for name in FIGURES:
        figures[name] = {key: SPREAD for key in ("stall_percent", "images_per_s", "wait_p95_ms",
                                                 "first_wait_ms", "epoch_s", "server_cpu_s")}
        figures[name]["open_ms"] = SPREAD if name.endswith("1") or "cold" in name else None
    figures["bucket, cold cache"]["stall_minus_local_pp"] = SPREAD
    result = CloudResult(store="store", batch_size=64, step_ms=50.0, latency_ms=20.0,
                         rate_mb_per_s_per_connection=100.0, shuffle="shard", shuffle_window=4,
                         rounds=3, samples=9600, figures=figures)
    doc = _json_round_trip(result)
    assert list(doc) == ["store", "batch_size", "step_ms", "latency_ms", "rate_mb_per_s_per_connection",
                         "shuffle", "shuffle_window", "rounds", "samples", "figures"]
    assert list(doc["figures"]) == list(FIGURES)
    rows = [line for line in result.table().splitlines() if line.startswith("| bucket")]
    assert "+2.0 (+1.0 to +3.0)" in rows[0] and "| - |" in rows[1]  # cold against local; warm none


def test_order_cost_holds_what_its_child_measures() -> None:
    from tilefeed.bench.suites.order_cost import STAGES, OrderCost, _measure

    measured = _measure(samples=4096, world_size=4, shuffle="global", rank=1, batch_size=64, seed=0)
    result = OrderCost(**measured)
    doc = _json_round_trip(result)
    assert list(doc) == list(measured) == [
        "samples", "world_size", "resumed_world_size", "rank", "shuffle", "batch_size", "seed",
        "saved_batches", "peak_reset", "baseline_mib", "stages"]
    assert set(doc["stages"]) == set(STAGES) and doc["stages"]["order"]["items"] == 1024
    assert "4,096 samples, world size 4" in result.table()


def test_parts_result_keeps_the_keys_of_its_dict() -> None:
    from tilefeed.bench.suites.parts import PartsResult

    result = PartsResult(store="store", batch_size=64, threads=2, batch_memory={"reused_ms": 0.5},
                         window_resize={"pillow_simd_us_per_tile_1_thread": 80.0},
                         jpeg_decode={"simplejpeg_fast_idct_img_per_s": 3000.0},
                         epoch_starts={"first_batch_ms": 4.0, "other_batches_ms": 1.0})
    doc = _json_round_trip(result)
    assert list(doc) == ["store", "batch_size", "threads", "batch_memory", "window_resize", "jpeg_decode",
                         "epoch_starts"]
    assert result.table().splitlines() == [
        "store: batches of 64 tiles, 2 threads", "batch_memory: reused_ms 0.5",
        "window_resize: pillow_simd_us_per_tile_1_thread 80.0",
        "jpeg_decode: simplejpeg_fast_idct_img_per_s 3,000.0",
        "epoch_starts: first_batch_ms 4.0, other_batches_ms 1.0"]


def test_scale_result_keeps_the_keys_of_its_dict_and_its_orders() -> None:
    from tilefeed.bench.suites.order_cost import OrderCost, _measure
    from tilefeed.bench.suites.scale import ScaleResult, ScaleRow

    def row(sources: int) -> ScaleRow:
        return ScaleRow(writer={"sources": sources, "peak_bytes": 1e8, "cpu_s": 1.0, "wall_s": 2.0,
                                "us_per_source": 10.0},
                        open={"seconds": 0.01, "growth_bytes": 1e6, "samples": sources},
                        read={"cpu_us": 1.0, "faults": 0.0}, info_s=0.5, verify_s=0.7, store=f"s{sources}",
                        rates=[100.0, 110.0])

    order = OrderCost(**_measure(samples=4096, world_size=4, shuffle="shard", rank=0, batch_size=64, seed=0))
    result = ScaleResult(rows=[row(100), row(200)], batch_size=256, size=8, workers=2, order=[order])
    doc = _json_round_trip(result)
    assert list(doc) == ["rows", "batch_size", "size", "workers", "order"]
    assert list(doc["rows"][0]) == ["writer", "open", "read", "info_s", "verify_s", "store", "rates"]
    assert doc["order"][0] == order.as_dict()
    table = result.table()
    assert "| | 100 sources | 200 sources | per added source |" in table
    assert table.endswith(order.table())


def test_stats_result_keeps_the_keys_of_its_dict() -> None:
    from tilefeed.bench.suites.stats import StatsOverhead, StatsResult

    overhead = StatsOverhead(on=[90.0, 95.0], off=[100.0, 100.0], cpu_us_on=[11.0, 12.0],
                             cpu_us_off=[10.0, 10.0], cost=0.075, cpu_cost=0.15, paired=[0.1, 0.05])
    before = {"workers": 1, "stall": 0.5, "bottleneck": "decode", "advice": "num_workers=4",
              "stats": "stats text"}
    result = StatsResult(overhead=overhead, advice={"before": before})
    doc = _json_round_trip(result)
    assert list(doc) == ["overhead", "advice"]
    assert list(doc["overhead"]) == ["on", "off", "cpu_us_on", "cpu_us_off", "cost", "cpu_cost", "paired"]
    assert doc["advice"] == {"before": before}  # no "after" key when the advice was not applied
    assert "the advice names no worker count to apply: num_workers=4" in result.table()


def test_soak_result_holds_each_pattern_as_before_and_the_verdict() -> None:
    from dataclasses import fields

    from tilefeed.bench.suites.soak import PatternResult, SoakResult

    def pattern(name: str, ok: bool) -> PatternResult:
        return PatternResult(pattern=name, unit="epoch", units=30, seconds=1.0, rss_start_mb=300,
                             rss_end_mb=301, rss_slope_kb=0.5, rss_growth_kb=10.0, rss_median_growth_kb=5.0,
                             threads=(20, 21), open_files=(9, 9), shm_segments=(1, 1), gpu_slope_kb=None, ok=ok)

    passed = SoakResult([pattern("a", True), pattern("b", True)], limit_kb=10.0)
    doc = _json_round_trip(passed)
    assert [list(p) for p in doc["patterns"]] == [[f.name for f in fields(PatternResult)]] * 2
    assert doc["ok"] is True and passed.table().endswith("flat after warm-up")
    failed = SoakResult([pattern("a", True), pattern("b", False)], limit_kb=10.0)
    assert not failed.ok and "soak: FAIL: b:" in failed.table()


@pytest.mark.parametrize("input_bound", [True, False])
def test_diagnosis_renders_its_lines(input_bound: bool) -> None:
    from tilefeed.bench.suites.diagnose import Diagnosis

    result = Diagnosis("baseline", 100.0, 200.0 if input_bound else 50.0, input_bound, ["one", "two"])
    assert _json_round_trip(result)["input_bound"] is input_bound
    assert result.table() == "one\ntwo"
