"""``tilefeed bench``: the loaders side by side (the default form), the sweep and the diagnosis
built on it, and the dispatch to the other forms (``tilefeed.cli.bench_forms``). Each form
parses its options before it loads its bench, so ``--help`` loads none."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tilefeed.cli import bench_forms
from tilefeed.cli.bench_options import form_parser, harness_args
from tilefeed.cli.demo_data import demo_images, demo_store


def bench_main(argv: Sequence[str]) -> int:
    argv = list(argv)
    if argv and argv[0] in FORMS:
        return FORMS[argv[0]](argv[1:])
    parser = form_parser(
        "tilefeed bench",
        "Measure how long each training step waits for its batch, for several loaders side by "
        "side on equal terms (same samples, batch, output and augmentation). Other forms: "
        f"tilefeed bench {{{','.join(FORMS)}}} --help.")
    harness_args(parser)
    args = parser.parse_args(argv)
    run_compare(args)
    return 0


def run_compare(args: argparse.Namespace) -> list[Any]:
    from tilefeed.bench.suites.compare import compare, report, settings_dict, write_json
    from tilefeed.bench.harness.plots import plot_runs

    settings, step = _resolve(args)
    runs, fair_line = compare(_names(args), settings, step, steps=args.steps, warmup=args.warmup)
    print(report(runs, fair_line, step.describe()))
    if args.json:
        write_json(args.json, runs, True, settings_dict(settings, step, args.steps, args.warmup))
        print(f"json: {args.json}")
    if args.plots:
        for path in plot_runs(runs, args.plots):
            print(f"plot: {path}")
    return runs


def _resolve(args: argparse.Namespace) -> tuple[Any, Any]:
    import torch

    from tilefeed.bench.peers.loaders import LOADERS, RowSettings
    from tilefeed.bench.harness.steps import EmulatedStep, ModelStep
    from tilefeed.pipeline.device import default_device
    from tilefeed.store.errors import ConfigError

    device = torch.device(args.device) if args.device else default_device()
    names = _names(args)
    unknown = [n for n in names if n not in LOADERS]
    if unknown or not names:
        raise ConfigError(f"unknown loader {unknown[0]!r}; choose from {', '.join(LOADERS)}"
                          if unknown else f"--loaders is empty; choose from {', '.join(LOADERS)}")
    images, store = args.images, args.store
    if images is None and (store is None or {"baseline", "dali-files"} & set(names)):
        images = demo_images(args.count)  # the loaders that read JPEGs need a folder of them
    if store is None and {"tilefeed", "tiles-dataloader"} & set(names):
        store = demo_store(images, args.size, args.codec)
    settings = RowSettings(images=images, store=store, batch_size=args.batch_size,
                              workers=args.workers, size=args.size, train=not args.eval,
                              device=device, output=args.output)
    if args.step == "model":
        width = args.model_width or (64 if device.type == "cuda" else 16)
        step: Any = ModelStep(device, width=width, accumulate=args.accumulate)
    else:
        step = EmulatedStep(args.step_ms, device)
    return settings, step


def _names(args: argparse.Namespace) -> list[str]:
    return [n.strip() for n in args.loaders.split(",") if n.strip()]


def _sweep(argv: list[str]) -> int:
    p = form_parser("tilefeed bench sweep", "Stall against step time (or worker count), per loader.")
    harness_args(p)
    p.add_argument("--over", choices=("step-ms", "workers"), default="step-ms")
    p.add_argument("--values", default="0,10,20,40,80", help="comma list of values to sweep")
    args = p.parse_args(argv)
    from tilefeed.bench.suites.compare import compare, settings_dict, write_json
    from tilefeed.bench.harness.watch import format_table
    from tilefeed.bench.harness.plots import plot_sweep

    values = [float(v) for v in args.values.split(",")]
    curves: dict[str, list[float]] = {name: [] for name in _names(args)}
    all_runs = []
    for v in values:
        if args.over == "step-ms":
            args.step_ms = v
        else:
            args.workers = int(v)
        settings, step = _resolve(args)
        runs, _ = compare(_names(args), settings, step, steps=args.steps, warmup=args.warmup)
        print(f"{args.over} = {v:g}\n{format_table(runs)}", flush=True)
        for r in runs:
            curves[r.loader].append(r.stall_fraction)
            r.extra[args.over] = v
        all_runs += runs
    plots = args.plots or Path(".")
    path = plot_sweep(values, curves, args.over, plots / "sweep.png")
    print(f"plot: {path}")
    if args.json:
        write_json(args.json, all_runs, True, settings_dict(settings, step, args.steps, args.warmup))
    return 0


def _diagnose(argv: list[str]) -> int:
    p = form_parser("tilefeed bench diagnose",
                    "Measure the loader alone and the step alone, say whether training is input-bound "
                    "and which lever helps, with the numbers behind it.")
    harness_args(p, loaders="baseline")
    args = p.parse_args(argv)
    from tilefeed.bench.suites.diagnose import diagnose

    settings, step = _resolve(args)
    print(diagnose(_names(args)[0], settings, step, steps=args.steps, warmup=args.warmup))
    return 0


# the forms in the order the help lists them
FORMS: dict[str, Callable[[list[str]], int]] = {
    "preprocess": bench_forms.preprocess_form, "loader": bench_forms.loader_form,
    "sweep": _sweep, "diagnose": _diagnose, "soak": bench_forms.soak_form,
    "aspect": bench_forms.aspect_form, "schedule": bench_forms.schedule_form,
    "gpu-report": bench_forms.gpu_report_form,
    "cloud": bench_forms.cloud_form, "clients": bench_forms.clients_form,
    "parts": bench_forms.parts_form, "stats": bench_forms.stats_form,
    "scale": bench_forms.scale_form,
}
