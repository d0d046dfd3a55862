"""Loader keyword arguments from open_clip's trainer (``open_clip_train``, which the
``open_clip_torch`` wheel ships): its argparse namespace read against the model's preprocess
config, by the rules of ``adapters``: every flag that reaches its data loading is a row of
``OPEN_CLIP_FLAGS``, honoured or refused in one line. ``open_clip_options`` returns the store
with the options, or the keywords of a ``Mix`` where ``--train-data`` joins stores with ``::``
or resamples them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import torch

from tilefeed.pipeline.recipe.adapters import H, R, Flag, refuse
from tilefeed.pipeline.recipe.recipe import ColorJitter, Interpolation, Recipe
from tilefeed.store.choices import choice
from tilefeed.store.errors import ConfigError

# open_clip's trainer (open_clip_train 3.3.0, the one the open_clip_torch wheel ships): every flag
# that reaches get_data (the datasets, their samplers and DataLoaders) and the model's preprocess
# config that shapes its transforms (open_clip.transform.image_transform: RandomResizedCrop at the
# model's size, aug_cfg's scale (default 0.9-1), torchvision's ratio, always bicubic, no flip, then
# normalisation; evaluation resizes with the config's filter and centre-crops). data_config is the
# model's preprocess_cfg (``model.visual.preprocess_cfg``: size, mean, std, interpolation, resize_mode)
OPEN_CLIP_SCALE: Final = (0.9, 1.0)  # open_clip's AugmentationCfg.scale


def _aug(args: Any) -> Mapping[str, Any]:
    return dict(getattr(args, "aug_cfg", None) or {})


def _side(config: Mapping[str, Any]) -> tuple[int, int]:
    size = config.get("size", 224)
    return (int(size), int(size)) if isinstance(size, (int, float)) else (int(size[-2]), int(size[-1]))


def _sources(value: str | None) -> list[str]:
    return [part for part in (value or "").split("::") if part]


# the filters open_clip's image transform takes (``--image-interpolation``)
OPEN_CLIP_FILTERS = (Interpolation.BICUBIC, Interpolation.BILINEAR, Interpolation.RANDOM)


OPEN_CLIP_FLAGS: dict[str, Flag] = {
    "dataset_type": Flag("--dataset-type tilefeed", H, "the choice the swap adds: --train-data and --val-data "
                         "name tilefeed stores (`tilefeed preprocess` of the shards, parquet files or table)"),
    "train_data": Flag("--train-data", H, "one store, or several joined by `::`: a Mix of them, named by "
                       "their folders"),
    "upsampling": Flag("--train-data-upsampling-factors", H, "Mix weights: each store's size times its "
                       "factor, as open_clip weighs its shards (open_clip asks --dataset-resampled with it; "
                       "the weights hold either way)"),
    "dataset_resampled": Flag("--dataset-resampled", H, "Mix(replacement=True): each position's sample drawn "
                              "with replacement, the same draws after a resume and on any world size"),
    "train_num_samples": Flag("--train-num-samples", H, "Mix epoch_samples: the samples of an epoch over all "
                              "ranks (a store repeats or is sub-sampled to fill it)"),
    "val_data": Flag("--val-data", H, "one store, read in order, whole, on the evaluating rank (rank 0 of 1, "
                     "as the script evaluates on its master alone), no batch dropped"),
    "val_sources": Flag("--val-data a::b", R, "several evaluation stores",
                        lambda a, c, t: not t and len(_sources(getattr(a, "val_data", None))) > 1),
    "val_num_samples": Flag("--val-num-samples", R, "a sample count of the evaluation set (the Loader "
                            "evaluates the whole store)",
                            lambda a, c, t: not t and getattr(a, "val_num_samples", None) is not None),
    "csv_keys": Flag("--csv-img-key/--csv-caption-key/--csv-separator", H, "no effect at training: `tilefeed "
                     "preprocess --csv-img-key/--csv-caption-key/--csv-separator` read the table with them "
                     "when the store was made; the caption column is the store's `caption`"),
    "json_text_key": Flag("--json-text-key/--json-text-key-probs", H, "(later open_clip; absent in 3.3.0) "
                          "caption names split on `;`, each sample's first not empty: text=[names]; with "
                          "probs, each sample's names in a weighted random order (a missing or 0 weight a "
                          "fallback after the drawn ones): text={name: prob}; without it the store's "
                          "`caption`"),
    "image_key": Flag("--image-key/--text-key/--max-image-pixels", H, "(later open_clip; absent in 3.3.0) "
                      "no effect at training: `tilefeed preprocess --image-key`, `--caption-key` and "
                      "`--max-pixels` apply them when the store is made"),
    "batch_size": Flag("--batch-size", H, "batch size per rank, training and evaluation: batch_size "
                       "(training drops the incomplete tail, as the script's DataLoader)"),
    "workers": Flag("--workers", H, "loader workers: num_workers (DALI's threads)"),
    "seed": Flag("--seed", H, "seed: the order, every crop and caption pick"),
    "size": Flag("--force-image-size (the model's image size)", H, "preprocess_cfg size: size (square)"),
    "shape": Flag("--force-image-size H W (not square)", R, "the Loader outputs square images",
                  lambda a, c, t: _side(c)[0] != _side(c)[1]),
    "mean": Flag("--image-mean/--image-std (the model's)", H,
                 "preprocess_cfg mean/std in 0..1 units: mean, std"),
    "interpolation": Flag("--image-interpolation (the model's)", H, "preprocess_cfg interpolation: the "
                          "evaluation resize's filter (random is bicubic there, as open_clip's); training "
                          "resizes bicubic whatever it says, as open_clip's RandomResizedCrop"),
    "resize_mode": Flag("--image-resize-mode (the model's)", H, "evaluation framing of a square tile "
                        "(shortest, longest and squash resize it alike); the picture's framing is the store's: "
                        "`tilefeed preprocess --fit crop` is shortest's, `pad` longest's, `stretch` squash's"),
    "scale": Flag("--aug-cfg scale=", H, "RandomResizedCrop area range (default 0.9-1): scale; ratio "
                  "torchvision's 3/4-4/3 and no flip, as open_clip's train transform"),
    "color_jitter": Flag("--aug-cfg color_jitter= color_jitter_prob=", H, "colour jitter (4 values) applied "
                         "with that probability: Recipe.color_jitter"),
    "gray_scale_prob": Flag("--aug-cfg gray_scale_prob=", H, "random grayscale: Recipe.grayscale"),
    "aug_unused": Flag("--aug-cfg ratio= re_prob= re_count= (color_jitter= without color_jitter_prob=)", H,
                       "no effect, as open_clip's own transform leaves them unused without use_timm (it "
                       "warns)"),
    "use_timm": Flag("--aug-cfg use_timm=True", R, "timm's create_transform in place of open_clip's",
                     lambda a, c, t: t and bool(_aug(a).get("use_timm", False))),
    "tokenizer": Flag("(the model's tokenizer)", H, "tokenizer: run on the reader threads, each batch's "
                      "(B, context_length) tokens"),
    "precision": Flag("--precision", H, "no effect: float32 images, which the script casts to its input dtype"),
    "device": Flag("--device", H, "the device batches land on: device (tokens stay on the host until the "
                   "script moves them)"),
    "imagenet_val": Flag("--imagenet-val/--imagenet-v2", H, "not swapped: zero-shot evaluation reads its "
                         "own ImageFolder, unchanged"),
    "distributed": Flag("(distributed launch)", H, "training: rank and world_size from torch.distributed "
                        "(DistributedSampler's split)"),
    "horovod": Flag("--horovod", R, "Horovod's ranks (no torch.distributed group to take them from)",
                    lambda a, c, t: bool(getattr(a, "horovod", False))),
}


def open_clip_options(args: Any, preprocess_cfg: Mapping[str, Any], *, train: bool,
                      tokenizer: Callable[[list[str]], torch.Tensor] | None) -> dict[str, Any]:
    """Loader keyword arguments, the store or mixture among them, for open_clip's trainer
    ``open_clip_train``.

    Parameters
    ----------
    args : argparse.Namespace
        ``open_clip_train.params.parse_args``'s output after ``main`` set it up (``args.device``,
        ``args.distributed``).
    preprocess_cfg : mapping
        The model's preprocess config (``model.visual.preprocess_cfg`` or
        ``open_clip.get_model_preprocess_cfg(model)``: size, mean and std in 0..1 units,
        interpolation, resize_mode), with the script's ``--image-*`` overrides in it.
    train : bool
        ``data["train"]`` (``--train-data``: RandomResizedCrop, shuffled, full batches) or
        ``data["val"]`` (``--val-data``: the evaluation transform, in order).
    tokenizer : callable, optional
        The script's ``get_tokenizer(args.model)``: list of str -> (B, L) tokens, run on the
        Loader's reader threads. None hands over the captions as str.

    Returns
    -------
    dict
        ``Loader(**options)``, the captions (``text``) and the tokenizer among them, so a batch
        is open_clip's ``(images, texts)``: ``store`` (a folder) or, where ``--train-data``
        joins stores with ``::`` or sets upsampling factors, ``--dataset-resampled`` or
        ``--train-num-samples``, ``mix`` (``Mix`` keywords: ``Loader(Mix(**options.pop("mix")),
        **options)``).

    Raises
    ------
    ConfigError
        Naming, in one line, each refused flag (``OPEN_CLIP_FLAGS``) the script would apply, or
        a flag's value the Loader cannot take.
    """
    refuse("open_clip_train", OPEN_CLIP_FLAGS, args, preprocess_cfg, train)
    flag = "--train-data" if train else "--val-data"
    sources = _sources(getattr(args, "train_data" if train else "val_data", None))
    if not sources:
        raise ConfigError(f"open_clip_train {flag}: name a tilefeed store (`tilefeed preprocess SRC STORE`)")
    options: dict[str, Any] = {
        **(_open_clip_store(args, sources) if train else {"store": sources[0]}),
        "batch_size": int(args.batch_size), "shuffle": train, "drop_last": train, "train": train,
        "seed": int(getattr(args, "seed", 0)), "size": _side(preprocess_cfg)[0],
        "mean": tuple(float(v) for v in preprocess_cfg["mean"]),
        "std": tuple(float(v) for v in preprocess_cfg["std"]),
        "num_workers": max(1, int(getattr(args, "workers", 1))), "device": getattr(args, "device", None),
        "text": _open_clip_text(args), "tokenizer": tokenizer,
    }
    if train:
        options["scale"] = tuple(float(v) for v in _aug(args).get("scale", OPEN_CLIP_SCALE))
        options["ratio"] = (3 / 4, 4 / 3)  # RandomResizedCrop's default: open_clip passes none
        options["recipe"] = _open_clip_recipe(args)
    else:  # the script evaluates on its master alone, the whole set: one rank of one
        options["rank"], options["world_size"], options["crop_pct"] = 0, 1, 1.0
        # open_clip asserts the same three; its random is bicubic in evaluation
        chosen = choice(Interpolation, str(preprocess_cfg.get("interpolation") or "bicubic"),
                        "open_clip_train --image-interpolation", among=OPEN_CLIP_FILTERS)
        filtered = Interpolation.BILINEAR if chosen is Interpolation.BILINEAR else Interpolation.BICUBIC
        options["recipe"] = Recipe(interpolation=filtered)
    return options


def _open_clip_store(args: Any, sources: list[str]) -> dict[str, Any]:
    """The training store: ``{"store": folder}``, or ``{"mix": Mix keywords}`` where open_clip
    would mix, resample or resize (the Mix is the caller's to make: mixing sits above the recipe)."""
    factors = _sources(getattr(args, "train_data_upsampling_factors", None))
    resampled = bool(getattr(args, "dataset_resampled", False))
    count = getattr(args, "train_num_samples", None)
    if len(sources) == 1 and not factors and not resampled and count is None:
        return {"store": sources[0]}
    folders = [s.rstrip("/").rsplit("/", 1)[-1] or s for s in sources]
    names = folders if len(set(folders)) == len(folders) else [f"{i}:{f}" for i, f in enumerate(folders)]
    weights = None
    if factors:
        if len(factors) != len(sources):
            raise ConfigError(f"open_clip_train --train-data-upsampling-factors: {len(factors)} factors for "
                              f"{len(sources)} --train-data sources")
        weights = {name: _store_size(source) * float(factor)
                   for name, source, factor in zip(names, sources, factors, strict=True)}
    return {"mix": {"stores": dict(zip(names, sources, strict=True)), "weights": weights,
                    "epoch_samples": None if count is None else int(count), "replacement": resampled}}


def _store_size(source: str) -> int:
    """A local store's sample count, read from its metadata alone."""
    from tilefeed.store.documents import open_store

    if "://" in source:
        raise ConfigError(f"open_clip_train --train-data-upsampling-factors with {source}: a bucket store's "
                          "size is not read here; give the Mix weights (size times factor) yourself")
    return int(open_store(source)[1].samples)


def _open_clip_text(args: Any) -> str | list[str] | dict[str, float]:
    """The caption names, as open_clip's later ``--json-text-key`` (names split on ``;``, the
    first not empty taken) and ``--json-text-key-probs`` (weights, the missing ones 0: fallbacks
    after the drawn ones) pick them; without them the store's ``caption``."""
    keys = getattr(args, "json_text_key", None)
    names = [k.strip() for k in (keys.split(";") if isinstance(keys, str) else list(keys or [])) if k.strip()]
    if not names:
        return "caption"
    probs = getattr(args, "json_text_key_probs", None)
    if probs is None:
        return names[0] if len(names) == 1 else names
    weights = [float(p) for p in (probs.split() if isinstance(probs, str) else probs)]
    if len(weights) > len(names):
        raise ConfigError(f"open_clip_train --json-text-key-probs: {len(weights)} values for {len(names)} "
                          "keys (open_clip refuses more values than keys)")
    return dict(zip(names, weights + [0.0] * (len(names) - len(weights)), strict=True))


def _open_clip_recipe(args: Any) -> Recipe:
    """open_clip's training transform after its crop: bicubic, no flip, jitter and grayscale by aug_cfg."""
    aug = _aug(args)
    jitter = None
    if aug.get("color_jitter_prob"):  # open_clip applies the jitter only with a probability
        values = aug.get("color_jitter")
        if not isinstance(values, (list, tuple)) or len(values) != 4:
            raise ConfigError("open_clip_train --aug-cfg color_jitter_prob needs color_jitter of 4 values "
                              "(open_clip asserts the same)")
        brightness, contrast, saturation, hue = (float(v) for v in values)
        jitter = ColorJitter(brightness, contrast, saturation, hue, p=float(aug["color_jitter_prob"]))
    return Recipe(interpolation=Interpolation.BICUBIC, hflip=0.0, color_jitter=jitter,
                  grayscale=float(aug.get("gray_scale_prob") or 0.0))
