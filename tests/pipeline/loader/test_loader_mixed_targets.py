"""A Mix of stores with targets: each sample's boxes and masks come from its own store (what
that store read alone gives, and torchvision v2's on the Loader's own windows), every sample once
an epoch, an elastic resume bit for bit, SSD's IoU crop against each sample's own boxes, a
store without targets only as background images, and what cannot be mixed refused in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tilefeed.pipeline import Loader, StoreReader
from tilefeed.pipeline.mixing.mix import Mix
from tilefeed.pipeline.reading.mixed_targets import combine_categories
from tilefeed.pipeline.recipe.recipe import Recipe
from tilefeed.bench.fixtures.generated import make_image_folder
from tilefeed.preprocess import TileSettings, preprocess
from tilefeed.preprocess.settings import TargetOptions
from tilefeed.store.errors import ConfigError
from tests.pipeline.loader.test_loader_targets import OPTS, T, by_sample, same_target, torchvision_targets
from tests.preprocess.targets_data import write_coco, write_semantic

ASKED: dict[str, Any] = dict(targets=("boxes", "masks"), **OPTS)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two COCO stores with instance masks (other pictures, other objects) and a store made
    without targets (background images)."""
    root = tmp_path_factory.mktemp("mixed-targets")
    out: dict[str, Path] = {}
    for name, seed, images in (("a", 0, 10), ("b", 1, 7)):
        coco = write_coco(root / f"set-{name}", seed=seed, images=images, planted=False)
        out[name] = root / name
        preprocess(coco.src, out[name], TileSettings(tile=T, fit="pad"), workers=1,
                   targets=TargetOptions(annotations=str(coco.annotations), instance_masks=True))
    out["neg"] = root / "neg"
    preprocess(make_image_folder(root / "negatives", classes=1, per_class=5, sizes=((64, 40), (40, 64))),
               out["neg"], TileSettings(tile=T, fit="pad"), workers=1)
    return out


def mix_of(stores: dict[str, Path], **options: Any) -> Mix:
    # the background store's folder class is not the detection stores' "image": labels kept apart
    return Mix(stores, labels="offset", background=("neg",), **options)


def sizes_of(stores: dict[str, Path]) -> dict[str, int]:
    sizes = {}
    for name, path in stores.items():
        with StoreReader(path) as reader:
            sizes[name] = len(reader)
    return sizes


def test_every_sample_once_with_what_its_store_alone_gives(stores: dict[str, Path]) -> None:
    """Evaluation (the whole letterbox, no draws): each sample of the mixture once, its boxes,
    labels and masks those of its store read on its own, and mapped back to its source image
    as there; a background image has none (and no frame to map through)."""
    got: dict[tuple[str, int], Any] = {}
    back: dict[tuple[str, int], np.ndarray] = {}
    with Loader(mix_of(stores), 4, targets=("boxes", "masks"), with_index=True, shuffle=True, seed=3) as loader:
        for images, targets, ids in loader:
            assert len(targets) == len(images)
            names, local = loader.source_of(ids)
            for k, (target, name, i) in enumerate(zip(targets, names, local.tolist(), strict=True)):
                assert (name, i) not in got
                got[name, i] = target
                if name != "neg":
                    back[name, i] = loader.boxes_to_source([target["boxes"]], ids[k:k + 1])[0]
                else:
                    with pytest.raises(ConfigError, match="'neg' holds no frames"):
                        loader.boxes_to_source([target["boxes"]], ids[k:k + 1])
    sizes = sizes_of(stores)
    assert set(got) == {(name, i) for name, n in sizes.items() for i in range(n)}
    objects = 0
    for name in ("a", "b"):
        with Loader(stores[name], 4, targets=("boxes", "masks"), with_index=True, shuffle=False) as alone:
            for _, targets, ids in alone:
                for target, i in zip(targets, ids.tolist(), strict=True):
                    assert same_target(got[name, i], target), (name, i)
                    assert np.array_equal(back[name, i], alone.boxes_to_source([target["boxes"]], [i])[0])
                    objects += len(target["boxes"])
    assert objects > 10
    for i in range(sizes["neg"]):
        target = got["neg", i]
        assert target["boxes"].shape == (0, 4) and target["labels"].shape == (0,)
        assert target["masks"].shape == (0, T, T)


def test_training_targets_are_torchvisions_on_each_stores_rows(stores: dict[str, Path]) -> None:
    """Random crops, drawn from the mixture's positions: each sample's targets are torchvision
    v2's of its own store's boxes and instance masks on the Loader's window."""
    with Loader(mix_of(stores), 4, **ASKED) as loader:
        positions = loader.epoch_positions(0).numpy()
        readers = dict(zip(loader.sources.mix.names, loader.reader.sources, strict=True))
        seen = background = 0
        for b, (_, targets, ids) in enumerate(loader):
            start, end, flip = loader.windows(0, positions[b * 4:(b + 1) * 4])
            names, local = loader.source_of(ids)
            for k, (name, i) in enumerate(zip(names, local.tolist(), strict=True)):
                got = targets[k]
                if name == "neg":
                    background += 1
                    assert len(got["boxes"]) == 0 and not got["masks"].any()
                    continue
                want = torchvision_targets(readers[name], i, start[k], end[k], int(flip[k]), 48)
                assert torch.equal(got["labels"], want["labels"])
                assert torch.allclose(got["boxes"].double(), want["boxes"].double(), atol=1e-3, rtol=0)
                assert torch.equal(got["masks"], want["masks"].to(torch.uint8))
                seen += len(got["boxes"])
        with pytest.raises(ConfigError, match="drawn from positions"):
            loader.boxes_to_source([targets[0]["boxes"]], ids[:1])
    assert seen > 10 and background == 5


def test_the_padded_layout_holds_the_dicts_boxes_with_counts(stores: dict[str, Path]) -> None:
    """Padded targets of a mixture: each image's boxes and labels are the dicts layout's, a
    background image's count 0 with every slot padded."""
    options = dict(targets="boxes", **OPTS)
    with Loader(mix_of(stores), 4, **options) as loader:
        dicts = list(loader)
    with Loader(mix_of(stores), 4, targets_layout="padded", max_objects=16, **options) as loader:
        padded = list(loader)
        sources = [loader.source_of(ids)[0] for _, _, ids in padded]
    empty = 0
    for (_, listed, i1), (_, table, i2), names in zip(dicts, padded, sources, strict=True):
        assert torch.equal(i1, i2) and table["boxes"].shape == (len(i1), 16, 4)
        for k, (target, name) in enumerate(zip(listed, names, strict=True)):
            count = int(table["counts"][k])
            assert count == len(target["boxes"]) and bool((table["labels"][k, count:] == -1).all())
            assert torch.equal(table["boxes"][k, :count], target["boxes"])
            assert torch.equal(table["labels"][k, :count], target["labels"])
            empty += name == "neg" and count == 0
    assert empty == 5


def test_an_elastic_resume_of_a_mixture_gives_the_same_targets_bit_for_bit(stores: dict[str, Path]) -> None:
    """Two ranks hand over a batch each; three ranks at another batch size finish the epoch:
    every sample's boxes and masks are those the uninterrupted run gave, none twice."""
    whole: dict[int, Any] = {}
    for rank in range(2):
        with Loader(mix_of(stores), 2, rank=rank, world_size=2, **ASKED) as loader:
            whole |= by_sample(list(loader))
    assert len(whole) == sum(sizes_of(stores).values())
    first: dict[int, Any] = {}
    states = []
    for rank in range(2):
        with Loader(mix_of(stores), 2, rank=rank, world_size=2, **ASKED) as loader:
            batch = next(iter(loader))
            states.append(loader.state_dict())
            first |= by_sample([batch])
    rest: dict[int, Any] = {}
    for rank in range(3):
        with Loader(mix_of(stores), 3, rank=rank, world_size=3, **ASKED) as loader:
            loader.load_state_dict(states[0])
            rest |= by_sample(list(loader))
    assert not first.keys() & rest.keys() and (first | rest).keys() == whole.keys()
    assert all(same_target((first | rest)[i], whole[i]) for i in whole)
    # the background stores are part of what a state means: a mixture that names none refuses it
    with Loader(Mix(stores, labels="offset"), 2, **OPTS) as other, pytest.raises(ConfigError, match="mixture"):
        other.load_state_dict(states[0])


def test_ssds_iou_crop_over_a_mixture_draws_against_each_samples_own_boxes(stores: dict[str, Path]) -> None:
    """``crop="iou"`` over a mixture: a window other than the whole picture holds the centre of
    some box of the sample's own store, and exactly the boxes whose centres it holds are kept."""
    cropped = 0
    with Loader(mix_of(stores), 4, targets="boxes", recipe=Recipe(crop="iou"), **OPTS) as loader:
        positions = loader.epoch_positions(0).numpy()
        readers = dict(zip(loader.sources.mix.names, loader.reader.sources, strict=True))
        for b, (_, targets, ids) in enumerate(loader):
            start, end, _ = loader.windows(0, positions[b * 4:(b + 1) * 4])
            names, local = loader.source_of(ids)
            for k, (name, i) in enumerate(zip(names, local.tolist(), strict=True)):
                reader = readers[name]
                rows = reader.targets.rows([i])[0] if reader.targets is not None else np.empty((0, 6))
                (top, left), (bottom, right) = start[k], end[k]
                whole = (top, left, bottom - top, right - left) == tuple(float(v) for v in reader.boxes[i])
                cx, cy = (rows[:, 0] + rows[:, 2]) / 2, (rows[:, 1] + rows[:, 3]) / 2
                held = (left < cx) & (cx < right) & (top < cy) & (cy < bottom)
                if not whole:
                    cropped += 1
                    assert held.any()
                # sanitising may drop a kept box cut too thin, never add one
                assert len(targets[k]["boxes"]) <= (len(rows) if whole else int(held.sum()))
                if not whole:
                    assert set(targets[k]["labels"].tolist()) <= set(rows[held, 4].astype(int).tolist())
    assert cropped > 0


def test_what_a_mixture_cannot_give_is_refused_in_one_line(stores: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match=r"'neg' holds no boxes or masks.*Mix\(background=") as caught:
        Loader(Mix(stores, labels="offset"), 4, targets="boxes")
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="crop='iou'.*'neg' holds no boxes"):
        Loader(Mix(stores, labels="offset"), 4, train=True, recipe=Recipe(crop="iou"))
    with pytest.raises(ConfigError, match="'a' holds targets.*drop it from background"):
        Loader(Mix(stores, labels="offset", background=("a", "neg")), 4)
    with pytest.raises(ConfigError, match="background names stores it does not hold"):
        Mix(stores, background=("nowhere",))
    with pytest.raises(ConfigError, match="collection of store names"):
        Mix(stores, background="neg")
    with Loader(Mix(stores, labels="offset"), 4) as plain:  # image labels: no targets, no question
        assert plain.samples == sum(sizes_of(stores).values())


def test_stores_keep_their_category_ids_and_must_name_them_alike() -> None:
    merged = combine_categories([[(1, "person"), (90, "toothbrush")], [], [(1, "person"), (3, "car")]],
                                ["a", "neg", "b"])
    assert merged == ((1, "person"), (3, "car"), (90, "toothbrush"))
    with pytest.raises(ConfigError, match="category 3 differently: 'a' calls it 'car', 'b' calls it 'bus'"):
        combine_categories([[(3, "car")], [(3, "bus")]], ["a", "b"])


def test_semantic_masks_give_background_images_the_background_class(stores: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    """A semantic store whose classes name ``background`` mixed with background images: their
    masks are that class inside the picture and 255 (ignore) in the pad, as a semantic store's;
    without such a class, and beside an instance store, the mixture is refused."""
    made = {}
    for name, classes in (("named", "background\ncar\nsky\ntree\nperson\n"), ("unnamed", None)):
        sem = write_semantic(tmp_path / name)
        if classes is not None:
            (sem.masks / "classes.txt").write_text(classes)
        made[name] = tmp_path / f"store-{name}"
        preprocess(sem.src, made[name], TileSettings(tile=T, fit="pad"), workers=1,
                   targets=TargetOptions(masks=str(sem.masks)))
    mix = Mix({"sem": made["named"], "neg": stores["neg"]}, labels="offset", background=("neg",))
    background = 0
    with Loader(mix, 4, targets="masks", with_index=True, shuffle=False) as loader:
        pictures = {n: r.boxes for n, r in zip(mix.names, loader.reader.sources, strict=True)}
        for _, targets, ids in loader:
            names, local = loader.source_of(ids)
            for k, (name, i) in enumerate(zip(names, local.tolist(), strict=True)):
                if name != "neg":
                    continue
                top, left, height, width = pictures[name][i].tolist()
                want = torch.full((T, T), 255, dtype=torch.uint8)
                want[top:top + height, left:left + width] = 0  # "background" is class 0 there
                assert torch.equal(targets[k]["masks"], want)
                assert (height, width) != (T, T)  # the pad is there to see
                background += 1
    assert background == 5
    with pytest.raises(ConfigError, match="name no category 'background'"):
        Loader(Mix({"sem": made["unnamed"], "neg": stores["neg"]}, labels="offset", background=("neg",)),
               4, targets="masks")
    with pytest.raises(ConfigError, match="masks differ in kind: 'sem' holds semantic masks, 'a' instance"):
        Loader(Mix({"sem": made["named"], "a": stores["a"]}, labels="offset"), 4, targets="masks")
