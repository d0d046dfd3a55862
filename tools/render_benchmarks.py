"""The benchmark tables of docs/benchmarks.md and README.md, each drawn from the JSON that a
``tilefeed bench`` command wrote (docs/data/, docs/img/sweep.json), never typed.

    python tools/render_benchmarks.py           # rewrite the tables of both pages
    python tools/render_benchmarks.py --check   # exit 1 when a page differs from its data

A table stands between ``<!-- data: NAME -->`` and ``<!-- /data -->``; NAME is one of ``TABLES``,
which names the JSON files it is drawn from and the function that draws it. Under each table a
line says where its figures come from: the command (as ``tools/bench_record.py`` recorded it),
the commit, the date, the machine and the load average before and after the run. The bench
forms' own ``table()`` draws each table where the form has one, from a result rebuilt from its
JSON, so the page shows what the terminal showed. Run it with the repository's ``src`` on
PYTHONPATH or tilefeed installed.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "data"
PAGES = (ROOT / "docs" / "benchmarks.md", ROOT / "README.md")
BLOCK = re.compile(r"(<!-- data: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /data -->)", re.S)
OPENING = re.compile(r"<!-- data: ([\w-]+) -->")

Json = dict[str, Any]


# -- the line under each table ---------------------------------------------------------------------
def _load_text(before: list[float] | None, after: list[float] | None) -> str:
    if not before:
        return "load average not recorded"
    return f"load average {before[0]:.2f} before, {after[0]:.2f} after" if after else \
        f"load average {before[0]:.2f} before"


def provenance_line(data: Json) -> str:
    """Where one JSON file's figures come from, in one line."""
    p = data.get("provenance")
    if not p:
        raise ValueError("the JSON has no provenance: record it with tools/bench_record.py")
    m = p["machine"]
    commit = p["commit"][:7] + ("-dirty" if p["commit"].endswith("-dirty") else "")
    versions = ", ".join(f"{name} {m[key]}" for name, key in (
        ("Python", "python"), ("torch", "torch"), ("DALI", "dali"), ("PIL", "pil")) if m.get(key))
    gpu = m.get("gpu") or "no GPU"
    runs = f" (run {p['repeat']} times)" if p.get("repeat", 1) > 1 else ""
    load = _load_text(p.get("load_before") or ([m["load_average_1m"]] if m.get("load_average_1m") is not None
                                                else None), p.get("load_after"))
    return (f"`{p['command']}`{runs}: commit {commit}, {p['date'][:10]}; {m['cores']} cores ({m['cpu']}), "
            f"{m['memory_gib']} GiB, {gpu}; {versions}; {load}")


def sources_text(files: list[tuple[str, Json]]) -> str:
    """The lines under a table: one paragraph per JSON file it is drawn from."""
    return "\n\n".join(f"<sub>{provenance_line(data)}</sub>" for _, data in files)


# -- a form's terminal text as Markdown ------------------------------------------------------------
def markdown(text: str) -> str:
    """A form's ``table()`` text on a page: its Markdown tables as they are, every other line a
    paragraph of its own (a table needs a blank line before it)."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("|") and blocks and blocks[-1][0].startswith("|"):
            blocks[-1].append(line)
        else:
            blocks.append([line])
    return "\n\n".join("\n".join(b) for b in blocks)


def _fence(text: str) -> str:
    return f"```text\n{text}\n```"


# -- each table ------------------------------------------------------------------------------------
def preprocess_table(files: list[Json]) -> str:
    from tilefeed.bench.suites.preprocess import PreprocessBenchResult

    return markdown(PreprocessBenchResult(**_fields(files[0])).table())


def loader_table(files: list[Json]) -> str:
    from tilefeed.bench.suites.loader import LoaderBenchResult

    return markdown(LoaderBenchResult(**_fields(files[0])).table())


def ffcv_table(files: list[Json]) -> str:
    """The loader form with ``--peer ffcv``: its comparison with FFCV, then its own uint8 lines."""
    from tilefeed.bench.suites.loader import LoaderBenchResult

    result = LoaderBenchResult(**_fields(files[0]))
    if not result.peer:
        raise ValueError("the loader JSON has no FFCV figures: record it with --peer ffcv")
    own, peer = result.table().split("\n\n| figure (img/s)")
    ratios = [line for line in own.splitlines() if line.startswith("uint8:")]
    return markdown("| figure (img/s)" + peer + "\n" + "\n".join(ratios))


def parts_table(files: list[Json]) -> str:
    """The parts form prints one line per pair; on the page each pair is a row."""
    from tilefeed.bench.suites.parts import PartsResult

    result = PartsResult(**_fields(files[0]))
    lines = [f"batches of {result.batch_size} tiles, {result.threads} threads, best of the rounds",
             "", "| part | figures |", "| --- | --- |"]
    for part, figures in result.as_dict().items():
        if isinstance(figures, dict):
            lines.append(f"| {part} | " + ", ".join(f"{k} {v:,.1f}" for k, v in figures.items()) + " |")
    return "\n".join(lines)


def _runs(data: Json) -> list[Json]:
    return [run for repeat in data.get("repeats", [data]) for run in repeat["runs"]]


def stall_table(files: list[Json]) -> str:
    """The main form at two step lengths, several runs of each: every run's stall, hand-over wait
    and epoch-start waits, and the median stall."""
    lines = ["| step | loader | stall, runs | median | mid-epoch wait med ms, runs | epoch start ms, runs |",
             "| --- | --- | --- | ---: | --- | --- |"]
    for data in files:
        repeats = data.get("repeats", [data])
        step = repeats[0]["settings"]["step"]  # as the step describes itself
        loaders = list(dict.fromkeys(r["loader"] for r in repeats[0]["runs"]))
        for name in loaders:
            runs = [r for rep in repeats for r in rep["runs"] if r["loader"] == name]
            shown = "baseline (PIL DataLoader)" if name == "baseline" else name
            stalls = [r["stall_fraction"] for r in runs]
            handovers = ", ".join(f"{r['handover_median_ms']:.2f}" for r in runs)
            starts = [statistics.median(r["epoch_start_wait_ms"]) for r in runs]
            lines.append(f"| {step} | {shown} | {', '.join(f'{s:.1%}' for s in stalls)} | "
                         f"{statistics.median(stalls):.1%} | "
                         f"{handovers} | "
                         f"{', '.join(f'{s:.1f}' for s in starts)} |")
    return "\n".join(lines) + "\n\nepoch start: each run's median wait for an epoch's first batch"


def outputs_table(files: list[Json]) -> str:
    """The Loader alone at each output layout: stall, hand-over wait, each epoch start's wait."""
    lines = ["| output | stall | mid-epoch wait med ms | images/s | epoch start ms (each start) |",
             "| --- | ---: | ---: | ---: | --- |"]
    for data in files:
        (run,) = data["runs"]
        layout = {"float32": "float32 NCHW", "channels_last": "float32 channels_last",
                  "uint8": "uint8 NHWC"}[data["settings"]["output"]]
        starts = ", ".join(f"{s:.2f}" for s in run["epoch_start_wait_ms"])
        lines.append(f"| {layout} | {run['stall_fraction']:.1%} | {run['handover_median_ms']:.2f} | "
                     f"{run['samples_per_s']:,.0f} | {starts} |")
    return "\n".join(lines)


def sweep_table(files: list[Json]) -> str:
    """Each loader at each step time: stall, images/s and the median wait per batch."""
    runs = files[0]["runs"]
    over = next(k for k in ("step-ms", "workers") if k in runs[0].get("extra", {}))
    values = list(dict.fromkeys(r["extra"][over] for r in runs))
    lines = ["| loader | figure | " + " | ".join(f"{over} {v:g}" for v in values) + " |",
             "| --- | --- |" + " ---: |" * len(values)]
    for name in dict.fromkeys(r["loader"] for r in runs):
        mine = {r["extra"][over]: r for r in runs if r["loader"] == name}
        for figure, key, fmt in (("stall", "stall_fraction", ".1%"), ("images/s", "samples_per_s", ",.0f"),
                                 ("wait median ms", "wait_median_ms", ".2f")):
            cells = " | ".join(format(mine[v][key], fmt) for v in values)
            lines.append(f"| {name} | {figure} | {cells} |")
    return "\n".join(lines)


def stats_table(files: list[Json]) -> str:
    """The clocks' cost; the decode-bound Loader's own stats text, and the runs before and after
    its advice."""
    from tilefeed.bench.suites.stats import StatsOverhead, StatsResult

    data = files[0]
    result = StatsResult(StatsOverhead(**data["overhead"]), data["advice"])
    text = result.table()
    stats = data["advice"]["before"]["stats"]
    head, tail = text.split(stats)
    return markdown(head) + "\n\n" + _fence(stats.strip()) + "\n\n" + markdown(tail)


def scale_table(files: list[Json]) -> str:
    """Every size's row, then one rank's epoch order per shuffle (as the form prints it)."""
    from tilefeed.bench.suites.order_cost import OrderCost
    from tilefeed.bench.suites.scale import ScaleResult, ScaleRow

    data = _fields(files[0])
    result = ScaleResult([ScaleRow(**row) for row in data["rows"]], data["batch_size"], data["size"],
                         data["workers"])
    orders = [OrderCost(**o).table() for o in data.get("order", [])]
    return result.table() + ("\n\n" + _fence("\n\n".join(orders)) if orders else "")


def cloud_table(files: list[Json]) -> str:
    from tilefeed.bench.suites.cloud import CloudResult

    result = CloudResult(**_fields(files[0]))
    return (f"{result.samples:,} samples, batch {result.batch_size}, shuffle={result.shuffle} (window "
            f"{result.shuffle_window}), a {result.step_ms:g} ms step; {result.latency_ms:g} ms added to every "
            f"request, {result.rate_mb_per_s_per_connection:g} MB/s per connection; medians and ranges of "
            f"{result.rounds} rounds\n\n" + result.table())


def clients_table(files: list[Json]) -> str:
    from tilefeed.bench.suites.clients import ClientsResult

    result = ClientsResult(**_fields(files[0]))
    return (f"a {result.shard_mb:g} MiB object; {result.tiles} ranges of {result.tile_kb:g} KiB as one batch; "
            f"medians and ranges of {result.rounds} rounds\n\n" + result.table())


def soak_table(files: list[Json]) -> str:
    from tilefeed.bench.suites.soak import PatternResult, SoakResult

    data = files[0]
    # JSON gives the (min, max) pairs back as lists
    pairs: list[Json] = [{k: tuple(v) if isinstance(v, list) else v for k, v in p.items()}
                         for p in data["patterns"]]
    patterns = [PatternResult(**p) for p in pairs]
    return markdown(SoakResult(patterns, data["limit_kb"]).table())


def recipe_table(files: list[Json]) -> str:
    from tilefeed.bench.suites.recipe import RecipeResult

    return markdown(RecipeResult.from_dict(_fields(files[0])).table())


def detection_table(files: list[Json]) -> str:
    from tilefeed.bench.suites.detection import DetectionResult

    return markdown(DetectionResult.from_dict(_fields(files[0])).table())


def clip_table(files: list[Json]) -> str:
    from tilefeed.bench.suites.clip import ClipResult

    return markdown(ClipResult.from_dict(_fields(files[0])).table())


def device_graph_table(files: list[Json]) -> str:
    from tilefeed.bench.suites.device_graph import DeviceGraphResult

    return markdown(DeviceGraphResult.from_dict(files[0]).table())


def _fields(data: Json) -> Json:
    """A bench's JSON without what the record added."""
    return {k: v for k, v in data.items() if k != "provenance"}


@dataclass(frozen=True)
class Table:
    """One table of the pages: the JSON files it is drawn from (relative to the repository) and
    the function that draws it from their data."""

    files: tuple[str, ...]
    draw: Callable[[list[Json]], str]


TABLES: dict[str, Table] = {
    "preprocess": Table(("docs/data/preprocess.json",), preprocess_table),
    "loader": Table(("docs/data/loader.json",), loader_table),
    "ffcv": Table(("docs/data/ffcv.json",), ffcv_table),
    "parts": Table(("docs/data/parts.json",), parts_table),
    "stall": Table(("docs/data/stall-50ms.json", "docs/data/stall-80ms.json"), stall_table),
    "outputs": Table(("docs/data/output-float32.json", "docs/data/output-channels_last.json",
                      "docs/data/output-uint8.json"), outputs_table),
    "sweep": Table(("docs/img/sweep.json",), sweep_table),
    "stats": Table(("docs/data/stats.json",), stats_table),
    "scale": Table(("docs/data/scale.json",), scale_table),
    "cloud": Table(("docs/data/cloud.json",), cloud_table),
    "clients": Table(("docs/data/clients.json",), clients_table),
    "soak": Table(("docs/data/soak.json",), soak_table),
    "recipe": Table(("docs/data/recipe.json",), recipe_table),
    "detection": Table(("docs/data/detection.json",), detection_table),
    "device-graph": Table(("docs/data/device-graph.json",), device_graph_table),
    "clip": Table(("docs/data/clip.json",), clip_table),
}


def render_block(name: str, root: Path = ROOT) -> str:
    """What stands between one table's markers: the table, then where its figures come from."""
    if name not in TABLES:
        raise ValueError(f"no table named {name!r}; the tables: {', '.join(TABLES)}")
    table = TABLES[name]
    loaded = [(path, json.loads((root / path).read_text())) for path in table.files]
    return table.draw([data for _, data in loaded]) + "\n\n" + sources_text(loaded) + "\n"


def render_page(text: str, root: Path = ROOT) -> str:
    """``text`` with every data block drawn again from its JSON."""
    def draw(m: re.Match[str]) -> str:
        return m.group(1) + "\n" + render_block(m.group("name"), root) + "\n" + m.group(4)

    return BLOCK.sub(draw, text)


def unmarked_tables(text: str) -> list[int]:
    """The lines (1-based) where a Markdown table starts outside every data block and code fence."""
    found, inside, fenced, previous = [], False, False, ""
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif OPENING.fullmatch(line.strip()):
            inside = True
        elif line.strip() == "<!-- /data -->":
            inside = False
        elif line.startswith("|") and not previous.startswith("|") and not (inside or fenced):
            found.append(number)
        previous = line
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/render_benchmarks.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a page differs")
    args = parser.parse_args(argv)
    stale = []
    for page in PAGES:
        text = page.read_text()
        rendered = render_page(text)
        if rendered != text:
            stale.append(page.relative_to(ROOT))
            if not args.check:
                page.write_text(rendered)
                print(f"wrote {page.relative_to(ROOT)}")
    if args.check and stale:
        print("differs from its data: " + ", ".join(map(str, stale))
              + " (run python tools/render_benchmarks.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
