"""``tilefeed bench``: the loaders side by side (the default form), the sweep and the diagnosis
built on it, and the dispatch to the other forms (``FORMS``: records run alike by
``tilefeed.cli.bench_forms.run_form``). Each form parses its options before it loads its bench,
so ``--help`` loads none."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tilefeed.cli import bench_forms
from tilefeed.cli.arguments import add_renamed, decimal_list
from tilefeed.cli.bench_forms import BenchResult, Form, run_form
from tilefeed.cli.bench_options import form_parser, harness_args
from tilefeed.cli.demo_data import demo_images, demo_store


def bench_main(argv: Sequence[str]) -> int:
    """``tilefeed bench ARGS``: the form named first, else the main form (options only)."""
    argv = list(argv)
    if argv and argv[0] in FORMS:
        return run_form(FORMS[argv[0]], argv[1:])
    if argv and not argv[0].startswith("-"):  # the main form takes no word: a form's name mistyped
        from tilefeed.store.errors import ConfigError

        raise ConfigError(f"unknown bench form {argv[0]!r}; the forms: {', '.join(FORMS)}")
    args = main_parser().parse_args(argv)
    run_compare(args)
    return 0


def main_parser() -> argparse.ArgumentParser:
    """The main form's parser; its help lists the other forms."""
    wide = max(map(len, FORMS))
    listing = "\n".join(f"  {name:<{wide}}  {form.summary}" for name, form in FORMS.items())
    parser = form_parser(
        "tilefeed bench",
        "Measure how long each training step waits for its batch, for several loaders side by "
        "side on equal terms (same samples, batch, output and augmentation). Other forms are "
        "listed below.",
        epilog=f"forms (tilefeed bench FORM --help for each one's options):\n{listing}")
    harness_args(parser)
    add_renamed(parser, "bench")
    return parser


def run_compare(args: argparse.Namespace) -> list[Any]:
    from tilefeed.bench.suites.compare import compare, report, settings_dict, write_json
    from tilefeed.bench.harness.plots import plot_runs

    settings, step = _resolve(args)
    runs, fair_line = compare(_names(args), settings, step, steps=args.steps, warmup=args.warmup)
    print(report(runs, fair_line, step.describe()))
    if args.out:
        write_json(args.out, runs, True, settings_dict(settings, step, args.steps, args.warmup))
        print(f"json: {args.out}")
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


def _sweep_options(p: argparse.ArgumentParser) -> None:
    harness_args(p)
    p.add_argument("--over", choices=("step-ms", "workers"), default="step-ms",
                   help="the setting swept: the emulated step's length or the workers of every loader")
    p.add_argument("--values", type=decimal_list, default="0,10,20,40,80",
                   help="comma list of the values swept")


def _sweep(args: argparse.Namespace) -> BenchResult:
    from tilefeed.bench.suites.compare import SweepResult, compare, settings_dict
    from tilefeed.bench.harness.watch import format_table
    from tilefeed.bench.harness.plots import save_figure, sweep_figure

    all_runs = []
    for v in args.values:
        if args.over == "step-ms":
            args.step_ms = v
        else:
            args.workers = int(v)
        settings, step = _resolve(args)
        runs, _ = compare(_names(args), settings, step, steps=args.steps, warmup=args.warmup)
        print(f"{args.over} = {v:g}\n{format_table(runs)}", flush=True)
        for r in runs:
            r.extra[args.over] = v
        all_runs += runs
    result = SweepResult(over=args.over, values=args.values, runs=all_runs, plot="",
                         settings=settings_dict(settings, step, args.steps, args.warmup))
    # the same picture the docs draw from a sweep's JSON: wait per batch and images/s
    result.plot = str(save_figure(sweep_figure(result.as_dict()), (args.plots or Path(".")) / "sweep.png"))
    return result


SWEEP = Form("sweep", "stall against step time (or worker count), per loader",
             "Stall against step time (or worker count), per loader.", _sweep_options, _sweep)


def _diagnose(args: argparse.Namespace) -> BenchResult:
    from tilefeed.bench.suites.diagnose import diagnose

    settings, step = _resolve(args)
    return diagnose(_names(args)[0], settings, step, steps=args.steps, warmup=args.warmup)


DIAGNOSE = Form(
    "diagnose", "is training input-bound, and which lever helps",
    "Measure the loader alone and the step alone, say whether training is input-bound "
    "and which lever helps, with the numbers behind it.", lambda p: harness_args(p, loaders="baseline"),
    _diagnose)

# the forms in the order the help lists them
FORMS: dict[str, Form] = {form.name: form for form in (
    bench_forms.PREPROCESS, bench_forms.LOADER, SWEEP, DIAGNOSE, bench_forms.SOAK, bench_forms.ASPECT,
    bench_forms.SCHEDULE, bench_forms.RECIPE, bench_forms.DETECTION, bench_forms.DEVICE_GRAPH,
    bench_forms.GPU_REPORT, bench_forms.CLOUD, bench_forms.CLIENTS, bench_forms.PARTS, bench_forms.STATS,
    bench_forms.SCALE, bench_forms.CLIP)}
