"""A Loader over a Mix of stores: exact shares, exactly once over ranks, elastic resume, the
ledger's audit, labels across stores, and the refusals."""

from __future__ import annotations

import json
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from tilefeed.pipeline import Loader
from tilefeed.pipeline.audit.ledger import audit, format_audit
from tilefeed.pipeline.loader.resume import STATE_VERSION
from tilefeed.pipeline.mixing.mix import Mix, Mixture
from tilefeed.pipeline.reading.mixed import LabelRule
from tilefeed.store.errors import ConfigAttributeError, ConfigError
from tests.helpers import assert_plain, killed_and_resumed, make_store, train_until_killed

UINT8 = dict(dtype=torch.uint8, layout="NHWC", with_index=True, num_workers=1)
EPOCH = 200
WEIGHTS = {"big": 0.3, "mid": 0.2, "small": 0.5}  # quotas 60 of 100, 40 of 50, 100 of 10


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    sizes = {"big": 20, "mid": 10, "small": 2}  # per class, 5 classes: 100, 50 and 10 samples
    return {name: make_store(tmp_path_factory.mktemp(name), "lz4", samples_per_class=n)
            for name, n in sizes.items()}


def mix(stores: dict[str, Path], **kwargs: object) -> Mix:
    return Mix(stores, weights=WEIGHTS, epoch_samples=EPOCH, **kwargs)  # type: ignore[arg-type]


def planned(loader: Loader, epoch: int) -> Counter[int]:
    """The epoch's planned multiset of samples (global ids), from the plan itself."""
    assert isinstance(loader.sources, Mixture)
    sources, samples = loader.sources.plan.locate(epoch, np.arange(EPOCH))
    offsets = np.asarray(loader.sources.reader.offsets)
    return Counter((offsets[sources] + samples).tolist())


def delivered(stores: dict[str, Path], world: int, epoch: int, **kwargs: object) -> tuple[Counter[int], Loader]:
    counts: Counter[int] = Counter()
    loader = None
    for rank in range(world):
        loader = Loader(mix(stores), 8, rank=rank, world_size=world, seed=5, **UINT8, **kwargs)  # type: ignore[arg-type]
        loader.set_epoch(epoch)
        with loader:
            for batch in loader:
                counts.update(batch[-1].tolist())
    assert loader is not None
    return counts, loader


def test_each_epoch_takes_the_exact_shares_and_the_repeat_and_visit_rules_hold(stores: dict[str, Path]) -> None:
    with Loader(mix(stores), 8, seed=5, **UINT8) as loader:  # type: ignore[arg-type]
        assert isinstance(loader.sources, Mixture) and loader.samples == EPOCH
        assert loader.sources.plan.quotas == (60, 40, 100)
        seen_big: list[set[int]] = []
        for epoch in range(4):
            got = Counter(i for batch in loader for i in batch[-1].tolist())
            assert got == planned(loader, epoch)
            names, samples = loader.source_of(list(got.elements()))
            assert Counter(names) == {"big": 60, "mid": 40, "small": 100}
            small = Counter(s for n, s in zip(names, samples.tolist(), strict=True) if n == "small")
            assert set(small.values()) == {10}  # ten times over: each exactly its share
            big = sorted(s for n, s in zip(names, samples.tolist(), strict=True) if n == "big")
            assert len(set(big)) == 60  # sub-sampled: no sample twice in an epoch
            seen_big.append(set(big))
        # 60 an epoch of 100: epochs 0 and 1 hold the stream's first cycle, every sample once
        assert len(seen_big[0] | seen_big[1]) == 100


@pytest.mark.parametrize("shuffle", [True, "none", "shard"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_exactly_once_over_ranks(stores: dict[str, Path], shuffle: object, drop_last: bool) -> None:
    for world in (1, 3, 4):
        got, loader = delivered(stores, world, epoch=1, shuffle=shuffle, drop_last=drop_last)
        plan = planned(loader, 1)
        extra, missing = got - plan, plan - got
        if drop_last:
            assert not extra and sum(missing.values()) < world * 8
        else:
            assert not missing and sum(extra.values()) < world


def test_shuffle_interleaves_the_sources(stores: dict[str, Path]) -> None:
    with Loader(mix(stores), EPOCH, seed=5, **UINT8) as loader:  # type: ignore[arg-type]
        names, _ = loader.source_of(next(iter(loader))[-1])
    runs = sum(1 for a, b in zip(names, names[1:], strict=False) if a != b)
    assert runs > 50  # blocks of one source would change source twice


def test_elastic_resume_on_another_world_size_and_the_audit(stores: dict[str, Path], tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    saved = []
    counts: Counter[int] = Counter()
    for rank in range(2):  # two ranks stop after 3 batches
        with Loader(mix(stores), 8, rank=rank, world_size=2, seed=5, ledger=ledger, **UINT8) as loader:  # type: ignore[arg-type]
            batches = iter(loader)
            for _ in range(3):
                counts.update(next(batches)[-1].tolist())
            saved.append(loader.state_dict())
    state = json.loads(json.dumps(saved[0]))
    assert state["version"] == STATE_VERSION and state["mixture"]
    for rank in range(3):  # three ranks finish the epoch
        with Loader(mix(stores), 16, rank=rank, world_size=3, seed=5, ledger=ledger, **UINT8) as loader:  # type: ignore[arg-type]
            loader.load_state_dict(state)
            for batch in loader:
                counts.update(batch[-1].tolist())
    plan = planned(loader, 0)
    assert not plan - counts and sum((counts - plan).values()) < 3
    (result,) = audit(ledger)
    assert result.ok and result.complete and result.population == EPOCH
    assert result.sources is not None and {n: c["planned"] for n, c in result.sources.items()} == {
        "big": 60, "mid": 40, "small": 100}
    assert sum(c["never"] for c in result.sources.values()) == 0
    assert "small" in format_audit([result])


def test_a_state_of_another_mixture_is_refused(stores: dict[str, Path]) -> None:
    with Loader(mix(stores), 8, seed=5, **UINT8) as loader:  # type: ignore[arg-type]
        state = loader.state_dict()
    other = Mix(stores, weights={"big": 0.5, "mid": 0.2, "small": 0.3}, epoch_samples=EPOCH)
    with Loader(other, 8, seed=5, **UINT8) as loader, pytest.raises(ConfigError, match="mixture="):  # type: ignore[arg-type]
        loader.load_state_dict(state)


def test_labels_follow_the_rule(stores: dict[str, Path]) -> None:
    with Loader(mix(stores), EPOCH, seed=5, **UINT8) as loader:  # type: ignore[arg-type]
        _, labels, ids = next(iter(loader))
        names, samples = loader.source_of(ids)
        for name, sample, label in zip(names, samples.tolist(), labels.tolist(), strict=True):
            assert label == loader.sources.reader.sources[["big", "mid", "small"].index(name)].labels[sample]
    with Loader(mix(stores, labels="offset"), EPOCH, seed=5, **UINT8) as loader:  # type: ignore[arg-type]
        _, labels, ids = next(iter(loader))
        names, _ = loader.source_of(ids)
        shift = {"big": 0, "mid": 5, "small": 10}
        assert all(shift[n] <= lab < shift[n] + 5 for n, lab in zip(names, labels.tolist(), strict=True))


def test_a_labels_rule_becomes_a_member_and_the_state_keeps_plain_strings(stores: dict[str, Path]) -> None:
    assert mix(stores).labels is LabelRule.SAME and mix(stores, labels="offset").labels is LabelRule.OFFSET
    assert mix(stores, labels="names") == mix(stores, labels=LabelRule.NAMES)
    with pytest.raises(ConfigError, match=r"^Mix labels must be one of same, offset, names, got 'union'$"):
        mix(stores, labels="union")
    states = []
    for labels in ("offset", LabelRule.OFFSET):  # a string and its member: the same mixture
        with Loader(mix(stores, labels=labels), 8, seed=5, shuffle="shard", **UINT8) as loader:  # type: ignore[arg-type]
            it = iter(loader)
            next(it)
            states.append(loader.state_dict())
            it.close()
    assert states[0] == states[1] and states[0]["shuffle"] == "shard"
    assert_plain(states[0], "state_dict")
    assert b"Shuffle" not in pickle.dumps(states[0])  # a member would be pickled by its class


def test_refusals(stores: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="same sources"):
        Mix(stores, weights={"big": 1.0})
    with pytest.raises(ConfigError, match="indices"):
        Loader(mix(stores), 8, indices=[0, 1], **UINT8)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Dataset"):
        _ = Loader(mix(stores), 8, **UINT8).dataset  # type: ignore[arg-type]


def test_a_mix_has_no_dataset_for_hasattr_yet_says_why(stores: dict[str, Path]) -> None:
    """timm's ``_set_loader_epoch`` and torchvision's ``evaluate`` ask ``hasattr(loader.dataset,
    ...)``-style questions: over a Mix, ``dataset`` is absent (an AttributeError, so ``hasattr``
    is False) and reading it still names the reason in one line."""
    with Loader(mix(stores), 8, **UINT8) as loader:  # type: ignore[arg-type]
        assert not hasattr(loader, "dataset") and getattr(loader, "dataset", "none") == "none"
        with pytest.raises(ConfigAttributeError) as caught:
            loader.dataset  # noqa: B018
        assert isinstance(caught.value, ConfigError) and isinstance(caught.value, AttributeError)
        assert "no single Dataset" in str(caught.value) and "\n" not in str(caught.value)
        with pytest.raises(AttributeError, match="no attribute 'datasets'"):  # a typo stays Python's
            loader.datasets  # noqa: B018
    with Loader(mix(stores), 8, **UINT8) as loader, pytest.raises(ConfigError):  # type: ignore[arg-type]
        loader.dataset  # noqa: B018  # still a ConfigError for those who catch that


def test_per_source_counts_agree_in_both_forms_of_the_tally() -> None:
    from tilefeed.pipeline.audit.ledger import _Tally

    for size in (10_000, 40):  # sorted arrays of places, then (past a thirty-second) bitmaps
        tally = _Tally(size)
        tally.add(np.array([3, 5, 5, 9, 17, 30]))
        assert (tally.bits is None) == (size == 10_000)
        assert tally.within(4, 18) == (3, 1) and tally.within(0, size) == (5, 1)
        assert tally.within(6, 9) == (0, 0)


def test_a_sample_repeated_in_an_epoch_is_cut_anew_each_time(stores: dict[str, Path]) -> None:
    """Crops and flips are drawn from the position: the small store's ten samples, each ten
    times in an epoch, come out as ten different crops each (not one image ten times)."""
    with Loader(mix(stores), EPOCH, seed=5, train=True, **UINT8) as loader:  # type: ignore[arg-type]
        images, _, ids = next(iter(loader))
    names, samples = loader.source_of(ids)
    small = [k for k, n in enumerate(names) if n == "small"]
    first = samples[small[0]]
    same = [images[k].numpy() for k in small if samples[k] == first]
    assert len(same) == 10
    assert len({image.tobytes() for image in same}) > 5


def test_windows_of_a_mixture_are_the_crops_it_cut(stores: dict[str, Path]) -> None:
    """``windows`` takes a mixture's positions (``epoch_positions``) and gives each the crop and
    flip the batch was cut with, checked against torch's resize of that window of the tile."""
    with Loader(mix(stores), EPOCH, seed=5, train=True, size=24, **UINT8) as loader:  # type: ignore[arg-type]
        images, _, ids = next(iter(loader))
        positions = loader.epoch_positions(0)
        start, end, flip = loader.windows(0, positions.numpy())
        assert loader.epoch_indices(0).tolist() == ids.tolist()
        assert isinstance(loader.sources, Mixture)
        readers = loader.sources.reader
    assert len(set(positions.tolist())) == EPOCH and flip.any() and not flip.all()
    for k in range(0, EPOCH, 7):
        (y0, x0), (y1, x1) = start[k].round().astype(int), end[k].round().astype(int)
        window = torch.from_numpy(readers.read(int(ids[k]))[y0:y1, x0:x1]).permute(2, 0, 1)[None].float()
        want = torch.nn.functional.interpolate(window, size=(24, 24), mode="bilinear", antialias=True,
                                               align_corners=False)[0].round().clamp(0, 255)
        want = (want.flip(-1) if flip[k] else want).permute(1, 2, 0)
        assert (images[k].float() - want).abs().mean() < 1.5, k


def test_wide_blocks_count_the_same_in_both_forms_of_the_tally() -> None:
    from tilefeed.pipeline.audit.ledger import _Tally

    rng = np.random.default_rng(3)
    places = np.sort(rng.integers(0, 1000, 900))
    sorted_form, bitmap_form = _Tally(10**9), _Tally(1000)
    sorted_form.add(places)
    bitmap_form.add(places)
    assert sorted_form.bits is None and bitmap_form.bits is not None
    for low, high in [(0, 1000), (3, 997), (8, 16), (5, 21), (17, 640), (999, 1000)]:
        assert bitmap_form.within(low, high) == sorted_form.within(low, high), (low, high)


def test_a_ledger_folder_of_another_mixture_is_refused(stores: dict[str, Path], tmp_path: Path) -> None:
    from tilefeed.store.errors import LedgerError

    with Loader(mix(stores), 8, seed=5, ledger=tmp_path, **UINT8):  # type: ignore[arg-type]
        pass
    other = Mix(stores, weights={"big": 0.5, "mid": 0.2, "small": 0.3}, epoch_samples=EPOCH)
    with pytest.raises(LedgerError, match="another store, subset or mixture"):
        Loader(other, 8, seed=5, ledger=tmp_path, **UINT8)  # type: ignore[arg-type]


@pytest.mark.parametrize("described", [
    {"names": ["a", "a"], "starts": [0, 100], "quotas": [100, 100]},
    {"names": ["a", "b"], "starts": [0, 2**63], "quotas": [2**63, 2**63 + 5]},
    {"names": "ab", "starts": [0, 100], "quotas": [100, 100]},
    {"names": ["a", "b"], "starts": [0, True], "quotas": [True, 199]},
])
def test_a_damaged_mixture_description_is_refused(tmp_path: Path, described: dict[str, object]) -> None:
    from tilefeed.pipeline.audit.ledger import COUNT
    from tilefeed.store.errors import LedgerError

    (tmp_path / COUNT).write_text(json.dumps({"samples": 200, "mixture": described}))
    with pytest.raises(LedgerError, match="do not tile"):
        audit(tmp_path)


def _killed_after_checkpoint(stores_json: str, ledger: str, state_file: str) -> None:
    stores = {name: Path(path) for name, path in json.loads(stores_json).items()}
    train_until_killed(Loader(mix(stores), 4, rank=0, world_size=2, seed=5, ledger=ledger, **UINT8),  # type: ignore[arg-type]
                       state_file)


@pytest.mark.slow
def test_a_kill_mid_epoch_and_an_elastic_resume_audit_clean(stores: dict[str, Path], tmp_path: Path) -> None:
    ledger, state_file = tmp_path / "ledger", tmp_path / "state.json"
    given = json.dumps({name: str(path) for name, path in stores.items()})
    code = (f"from tests.pipeline.mixing.test_mix import _killed_after_checkpoint; "
            f"_killed_after_checkpoint({given!r}, {str(ledger)!r}, {str(state_file)!r})")
    def loader_of(batch: int, rank: int, world: int) -> Loader:
        return Loader(mix(stores), batch, rank=rank, world_size=world, seed=5, ledger=ledger, **UINT8)  # type: ignore[arg-type]

    epoch = killed_and_resumed(loader_of, code, ledger, state_file)
    assert epoch.complete and epoch.ok and epoch.never == 0 and epoch.runs == 5
    assert epoch.sources is not None and all(c["never"] == 0 for c in epoch.sources.values())


def test_a_subset_of_a_store_is_all_the_mixture_takes_of_it(stores: dict[str, Path]) -> None:
    """indices per store: the big store's even samples only (a split), sub-sampled by weight;
    over two epochs every one of the 50 is visited before any again, and nothing else is."""
    split = {"big": list(range(0, 100, 2))}
    with Loader(Mix(stores, weights={"big": 0.2, "mid": 0.3, "small": 0.5}, epoch_samples=EPOCH,  # type: ignore[arg-type]
                    indices=split), 8, seed=5, **UINT8) as loader:
        seen: list[set[int]] = []
        for _ in range(2):
            names, samples = loader.source_of([i for b in loader for i in b[-1].tolist()])
            big = [s for n, s in zip(names, samples.tolist(), strict=True) if n == "big"]
            assert len(big) == len(set(big)) == 40 and set(big) <= set(split["big"])
            seen.append(set(big))
        assert seen[0] | seen[1] == set(split["big"])  # 40 an epoch of 50: the first cycle by epoch 1
    for bad, message in [({"nope": [1]}, "does not hold"), ({"big": [0, 0]}, "repeat"),
                         ({"big": [100]}, "0..99")]:
        with pytest.raises(ConfigError, match=message):
            Loader(Mix(stores, weights=WEIGHTS, epoch_samples=EPOCH, indices=bad), 8, **UINT8)  # type: ignore[arg-type]
