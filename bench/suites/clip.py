"""``tilefeed bench clip``: open_clip's training input from the same img2dataset-style shards
through the Loader and through the loaders CLIP training runs on.

Every row hands over open_clip's training batch, ``(images, tokens)``: a random-resized crop of
90-100 % of the picture, bicubic, to ``size``, CLIP's normalisation, float32 NCHW, and the
caption through the ViT-B-32 tokenizer, ``(B, 77)``. The rows:

- the Loader as a swapped open_clip trainer builds it (``open_clip_options``) over a store made
  from the shards by ``tilefeed preprocess`` with JPEG tiles (the highest of ``qualities`` whose
  store is no larger than the tars) and with the default lz4 tiles;
- open_clip's own WebDataset pipeline (``get_wds_dataset``) over the tars as they are;
- LitData's ``StreamingDataset`` over ``litdata.optimize``'s copy of the pairs, where litdata is
  installed (else the row is absent, with the reason).

Each round converts the shards again for every row that needs a copy (timed) and measures each
row twice: images/s with no step, and the stall (the share of the time the step waits for its
batch) at an emulated ``step_ms`` step. The rows alternate their order each round; every figure
is a median and range over the rounds. A comparison whose rows delivered different batches is
refused.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import io
import json
import shutil
import tarfile
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Final

import numpy as np
import torch

from tilefeed.bench.fixtures.generated import synthetic_image
from tilefeed.bench.harness.sides import Figure, figures
from tilefeed.bench.harness.steps import EmulatedStep
from tilefeed.bench.harness.watch import RunResult, measure
from tilefeed.bench.peers.clip_peers import (CONTEXT_LENGTH, IMAGE_EXTENSIONS, Batches, clip_tokenizer,
                                             litdata_loader, litdata_optimize, tar_paths, wds_loader)
from tilefeed.bench.suites.compare import UnfairComparison
from tilefeed.pipeline import Loader
from tilefeed.pipeline.device import default_device
from tilefeed.pipeline.recipe.open_clip_adapter import open_clip_options
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tilefeed.preprocess.sources.scanning import PairOptions, SourceKind
from tilefeed.store.format import Codec
from tilefeed.store.inspection import bytes_on_disk
from tilefeed.store.host import usable_cores

JPEG_TILES, LZ4_TILES = "tilefeed, JPEG tiles", "tilefeed, lz4 tiles"
WEBDATASET, LITDATA = "WebDataset (open_clip)", "LitData"
ROWS: Final = (JPEG_TILES, LZ4_TILES, WEBDATASET, LITDATA)
_FOLDERS: Final = {JPEG_TILES: "jpeg", LZ4_TILES: "lz4", WEBDATASET: "webdataset", LITDATA: "litdata"}
QUALITIES: Final = (95, 90, 85, 75)  # tried in turn until the JPEG store is no larger than the tars
# CLIP's normalisation (open_clip.OPENAI_DATASET_MEAN/STD): the ViT-B-32 model's preprocess config
CLIP_MEAN: Final = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD: Final = (0.26862954, 0.26130258, 0.27577711)
WARMUP = 2

_SUBJECTS = ("dog", "cat", "bicycle", "lighthouse", "bowl of soup", "red car", "mountain lake", "street market",
             "wooden chair", "child with a kite", "old bridge", "field of sunflowers")
_PLACES = ("at dusk", "in the rain", "on a sunny morning", "seen from above", "in a small town", "by the sea",
           "under a cloudy sky", "in a studio")
_STYLES = ("a photo of", "a close-up photograph of", "a blurry picture of", "an old photograph of",
           "a wide shot of")


def caption(rng: np.random.Generator) -> str:
    """A caption as alt texts read: a style, a subject, a place, sometimes a few more words."""
    words = [str(rng.choice(_STYLES)), "a" if rng.random() < 0.5 else "the", str(rng.choice(_SUBJECTS)),
             str(rng.choice(_PLACES))]
    if rng.random() < 0.4:
        words.append(f"- stock image {int(rng.integers(10_000, 99_999))}")
    return " ".join(words)


def make_clip_shards(root: str | Path, *, count: int = 2048, shard_samples: int = 256, seed: int = 0,
                     sizes: tuple[tuple[int, int], ...] = ((500, 375), (375, 500), (500, 333), (640, 480)),
                     quality: int = 90) -> Path:
    """Write img2dataset's layout of ``count`` generated photographs with captions under ``root``.

    Each tar ``00000.tar``, ... holds ``shard_samples`` samples as ``KEY.jpg``, ``KEY.txt`` (the
    caption) and ``KEY.json`` (img2dataset's fields: key, caption, status, sizes); a tar already
    there is kept, so a complete set is made once.

    Parameters
    ----------
    root : str or Path
        The folder of the tars.
    count : int, default 2048
        Samples in all.
    shard_samples : int, default 256
        Samples per tar (the last may hold fewer).
    seed : int, default 0
        The pictures' and captions' seed.
    sizes : tuple of (int, int)
        The pictures' (width, height), drawn per sample.
    quality : int, default 90
        JPEG quality of the pictures.

    Returns
    -------
    Path
        ``root``.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for shard, start in enumerate(range(0, count, shard_samples)):
        path = root / f"{shard:05d}.tar"
        if path.exists():
            continue
        rng = np.random.default_rng([seed, shard])
        partial = path.with_suffix(".tmp")
        with tarfile.open(partial, "w") as tar:
            for k in range(min(shard_samples, count - start)):
                key = f"{shard:05d}{k:04d}"
                width, height = sizes[int(rng.integers(len(sizes)))]
                picture = io.BytesIO()
                synthetic_image(np.random.default_rng(int(rng.integers(2**31))), width, height).save(
                    picture, "JPEG", quality=quality)
                text = caption(rng)
                meta = {"url": f"https://example.invalid/{key}.jpg", "key": key, "caption": text,
                        "status": "success", "error_message": None, "width": width, "height": height,
                        "original_width": width, "original_height": height}
                for ext, data in (("jpg", picture.getvalue()), ("txt", text.encode()),
                                  ("json", json.dumps(meta).encode())):
                    member = tarfile.TarInfo(f"{key}.{ext}")
                    member.size, member.mtime = len(data), 0
                    tar.addfile(member, io.BytesIO(data))
        partial.rename(path)
    return root


def count_pairs(tars: Iterable[Path]) -> int:
    """Samples with an image and a caption in the tars, from their headers alone."""
    total = 0
    for path in tars:
        with tarfile.open(path) as tar:
            kinds: dict[str, set[str]] = {}
            for member in tar:
                if member.isfile():
                    key, _, ext = member.name.rpartition(".")
                    kinds.setdefault(key, set()).add(ext.lower())
        total += sum(1 for exts in kinds.values() if "txt" in exts and exts & set(IMAGE_EXTENSIONS))
    return total


@dataclass
class ClipResult:
    """Every row's figures over the rounds, what its batches held, and the rows left out.

    Attributes
    ----------
    step_ms : float
        The emulated step the stall is measured at.
    rate, stall : dict of str to Figure
        Row -> images/s with no step; the share of the run spent waiting at the step.
    disk_bytes, conversion_s : dict of str to Figure
        Row -> bytes on disk of what it reads; seconds to make it from the shards (0 for the
        shards themselves).
    batches : dict of str to dict
        Row -> its batches' images and tokens shapes and dtypes, and the samples of each run.
    absent : dict of str to str
        Row -> why it was not measured.
    settings : dict
        What the run was measured with (samples, tars, batch, workers, size, versions).
    fair : str
        What every row delivered alike.
    runs : list of dict
        Every measured run's figures.
    """

    step_ms: float
    rate: dict[str, Figure]
    stall: dict[str, Figure]
    disk_bytes: dict[str, Figure]
    conversion_s: dict[str, Figure]
    batches: dict[str, dict[str, Any]]
    absent: dict[str, str]
    settings: dict[str, Any]
    fair: str
    runs: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClipResult:
        """The result again from ``as_dict``'s data (what ``--out`` wrote)."""
        return cls(step_ms=data["step_ms"], rate=figures(data["rate"]), stall=figures(data["stall"]),
                   disk_bytes=figures(data["disk_bytes"]), conversion_s=figures(data["conversion_s"]),
                   batches=data["batches"], absent=data["absent"], settings=data["settings"],
                   fair=data["fair"], runs=data.get("runs", []))

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return asdict(self)

    def label(self, row: str) -> str:
        """The row's name in the table: the JPEG store with its quality."""
        return f"{row} (q{self.settings['jpeg_quality']})" if row == JPEG_TILES else row

    def table(self) -> str:
        """Every row's images/s, stall, bytes on disk and conversion time; the rows left out; what
        the batches held."""
        s = self.settings
        lines = [f"open_clip's training input: {s['samples']:,} samples in {s['tars']} img2dataset-style tars "
                 f"({s['tar_bytes'] / 1e6:,.1f} MB), random-resized crop 0.9-1 to {s['size']} and ViT-B-32 "
                 f"tokens; batch {s['batch_size']}, {s['workers']} workers, {s['rounds']} interleaved rounds "
                 "(median, range):",
                 f"| loader | img/s, no step | stall at a {self.step_ms:g} ms step | disk MB | conversion s |",
                 "| --- | ---: | ---: | ---: | ---: |"]
        for row in self.rate:
            disk = Figure([b / 1e6 for b in self.disk_bytes[row].rounds])
            lines.append(f"| {self.label(row)} | {self.rate[row].text(',.0f')} | "
                         f"{self.stall[row].text('.1%')} | {disk.text(',.1f')} | "
                         f"{self.conversion_s[row].text('.1f')} |")
        lines += [f"{row}: not measured: {why}" for row, why in self.absent.items()]
        lines.append(self.fair)
        return "\n".join(lines)


def _close(loader: Any) -> None:
    close: Callable[[], None] | None = getattr(loader, "close", None)
    if close is not None:
        close()


def bench_clip(shards: Path, work: Path, *, batch_size: int = 64, workers: int = 2, size: int = 224,
               steps: int = 30, step_ms: float = 50.0, rounds: int = 3, seed: int = 0,
               qualities: tuple[int, ...] = QUALITIES) -> ClipResult:
    """Measure every row on the shards, rounds interleaved.

    Parameters
    ----------
    shards : Path
        A folder of img2dataset-style ``.tar`` shards (``KEY.jpg``, ``KEY.txt``, ``KEY.json``); at
        least ``workers`` of them (open_clip's pipeline splits tars between its workers).
    work : Path
        A folder for each round's converted copies (removed once measured).
    batch_size : int, default 64
        Samples per batch, every row.
    workers : int, default 2
        Every row's workers: open_clip's and LitData's DataLoader processes, the Loader's
        threads, and the conversions' processes.
    size : int, default 224
        The output side (ViT-B-32's).
    steps : int, default 30
        Steps measured per run (after two of warm-up).
    step_ms : float, default 50
        The emulated step the stall is measured at.
    rounds : int, default 3
        Interleaved rounds; figures are medians and ranges.
    seed : int, default 0
        Every row's shuffle seed.
    qualities : tuple of int
        JPEG qualities tried in the first round, highest first, until the store is no larger
        than the tars; the last is kept whatever its size.

    Returns
    -------
    ClipResult

    Raises
    ------
    UnfairComparison
        When the rows' batches differ (count, images or tokens shape, dtype).
    """
    tars = tar_paths(shards)
    samples = count_pairs(tars)
    tar_bytes = sum(bytes_on_disk(p) for p in tars)
    tokenizer, tokenizer_source = clip_tokenizer()
    device = default_device()
    tile = max(size, round(size * 8 / 7))  # 256 for 224: preprocessing's default tile
    absent: dict[str, str] = {}
    if importlib.util.find_spec("litdata") is None:
        absent[LITDATA] = "litdata is not installed (pip install litdata)"
        print(f"{LITDATA}: not measured: {absent[LITDATA]}", flush=True)
    rows = [row for row in ROWS if row not in absent]
    quality = qualities[0]
    chosen = False
    work.mkdir(parents=True, exist_ok=True)

    def convert(row: str, out: Path) -> tuple[Path, float]:
        """What the row reads, made from the shards, and the seconds its (last) making took."""
        nonlocal quality, chosen
        if row == WEBDATASET:
            return shards, 0.0
        began = time.perf_counter()
        if row == LITDATA:
            litdata_optimize(tars, out, workers=workers)
            return out, time.perf_counter() - began
        codec = Codec.JPEG if row == JPEG_TILES else Codec.LZ4
        for q in qualities if codec is Codec.JPEG and not chosen else (quality,):
            began = time.perf_counter()
            preprocess(shards, out, TileSettings(tile=tile), StoreSettings(codec=codec, quality=q),
                       workers=workers, overwrite=True, pairs=PairOptions(source=SourceKind.WEBDATASET))
            made = time.perf_counter() - began
            if codec is Codec.JPEG:
                quality = q
            if codec is not Codec.JPEG or bytes_on_disk(out) <= tar_bytes:
                break
        chosen = chosen or codec is Codec.JPEG
        return out, made

    def loader(row: str, source: Path) -> Batches:
        if row == WEBDATASET:
            return wds_loader(tars, batch_size=batch_size, workers=workers, size=size, samples=samples,
                              tokenizer=tokenizer, seed=seed)
        if row == LITDATA:
            return litdata_loader(source, batch_size=batch_size, workers=workers, size=size, seed=seed)
        args = argparse.Namespace(train_data=str(source), batch_size=batch_size, workers=workers, seed=seed,
                                  device=device)
        config = {"size": size, "mean": CLIP_MEAN, "std": CLIP_STD, "interpolation": "bicubic",
                  "resize_mode": "shortest"}
        options = open_clip_options(args, config, train=True, tokenizer=tokenizer)
        return Batches(Loader(options.pop("store"), **options))

    def run(row: str, source: Path, ms: float) -> tuple[RunResult, Batches]:
        batches = loader(row, source)
        try:
            with warnings.catch_warnings():
                if ms == 0.0:  # no step on purpose: the loader's own pace is the figure asked for
                    warnings.filterwarnings("ignore", message="the step took a median")
                return measure(batches, EmulatedStep(ms, device), steps=steps, warmup=WARMUP, name=row,
                               device=device), batches
        finally:
            batches.release()
            _close(batches)
            gc.collect()  # a DataLoader's persistent workers end with it, before the next row starts

    rate: dict[str, list[float]] = {row: [] for row in rows}
    stall: dict[str, list[float]] = {row: [] for row in rows}
    size_on_disk: dict[str, list[float]] = {row: [] for row in rows}
    seconds: dict[str, list[float]] = {row: [] for row in rows}
    kinds: dict[str, set[tuple[Any, ...]]] = {row: set() for row in rows}
    counts: dict[str, list[int]] = {row: [] for row in rows}
    runs: list[dict[str, Any]] = []
    for r in range(rounds):
        for row in rows if r % 2 == 0 else rows[::-1]:
            out = work / f"round{r}-{_FOLDERS[row]}"
            shutil.rmtree(out, ignore_errors=True)
            source, made = convert(row, out)
            seconds[row].append(made)
            size_on_disk[row].append(float(tar_bytes if row == WEBDATASET else bytes_on_disk(source)))
            try:
                for ms in (0.0, step_ms):
                    result, batches = run(row, source, ms)
                    (rate if ms == 0.0 else stall)[row].append(
                        result.samples_per_s if ms == 0.0 else result.stall_fraction)
                    kinds[row] |= batches.kinds
                    counts[row].append(result.samples)
                    runs.append({"round": r, "loader": row, "step_ms": ms,
                                 "samples_per_s": result.samples_per_s, "stall": result.stall_fraction,
                                 "samples": result.samples, "wait_median_ms": result.wait_median_ms})
                    print(f"round {r + 1}/{rounds} {row}, step {ms:g} ms: {result.samples_per_s:,.0f} img/s, "
                          f"stall {result.stall_fraction:.1%}", flush=True)
            finally:
                if source != shards:
                    shutil.rmtree(source, ignore_errors=True)
    batches_held = {row: _held(kinds[row], counts[row]) for row in rows}
    settings = {"samples": samples, "tars": len(tars), "tar_bytes": tar_bytes, "shards": str(shards),
                "batch_size": batch_size, "workers": workers, "size": size, "tile": tile, "steps": steps,
                "warmup": WARMUP, "rounds": rounds, "seed": seed, "jpeg_quality": quality,
                "tokenizer": tokenizer_source, "cores": usable_cores(),
                "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
                "versions": {name: _version(name) for name in ("torch", "open_clip_torch", "webdataset",
                                                               "litdata", "tilefeed")}}
    return ClipResult(step_ms=step_ms, rate={k: Figure(v) for k, v in rate.items()},
                      stall={k: Figure(v) for k, v in stall.items()},
                      disk_bytes={k: Figure(v) for k, v in size_on_disk.items()},
                      conversion_s={k: Figure(v) for k, v in seconds.items()}, batches=batches_held,
                      absent=absent, settings=settings, fair=fairness(batches_held), runs=runs)


def _held(kinds: set[tuple[Any, ...]], counts: list[int]) -> dict[str, Any]:
    """What a row's batches held: one shape and dtype each for images and tokens, where all agree."""
    if len(kinds) != 1:
        return {"kinds": sorted([list(map(str, k)) for k in kinds]), "samples": counts}
    images, images_dtype, tokens, tokens_dtype = next(iter(kinds))
    return {"images": list(images), "images_dtype": images_dtype, "tokens": list(tokens),
            "tokens_dtype": tokens_dtype, "samples": counts}


def fairness(held: dict[str, dict[str, Any]]) -> str:
    """One line saying what every row's batches held; UnfairComparison where any differs."""
    keys = {row: json.dumps(h, sort_keys=True) for row, h in held.items()}
    if len(set(keys.values())) > 1 or any("kinds" in h for h in held.values()):
        raise UnfairComparison("refusing to compare rows whose batches differ: "
                               + "; ".join(f"{row}: {key}" for row, key in keys.items()))
    h = next(iter(held.values()))
    if h["tokens"][1:] != [CONTEXT_LENGTH]:
        raise UnfairComparison(f"tokens of shape {h['tokens']}, not (B, {CONTEXT_LENGTH})")
    return (f"fair: every row delivered {h['samples'][0]:,} samples per run in batches of images "
            f"{tuple(h['images'])} {h['images_dtype']} and tokens {tuple(h['tokens'])} {h['tokens_dtype']}")


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None
