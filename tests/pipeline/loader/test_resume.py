"""Resume that holds inside real training loops: set_epoch, elastic world and batch sizes,
bit-for-bit batches through torch.save, and the exactly-once ledger."""

from __future__ import annotations

import itertools
import json
import pickle
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tilefeed.pipeline import Loader, StoreReader
from tilefeed.pipeline.audit.ledger import COUNT, POPULATION, _Tally, _unpack, audit
from tilefeed.pipeline.loader.resume import STATE_VERSION
from tilefeed.pipeline.options import Layout, Shuffle
from tilefeed.store.errors import ConfigError, LedgerError
from tests.helpers import assert_plain, free_port, join_gloo, killed_and_resumed, run_cli, train_until_killed

UINT8 = dict(dtype=torch.uint8, layout="NHWC", with_index=True, num_workers=1)


def indices_of(batches: list[tuple[torch.Tensor, ...]]) -> list[int]:
    return [i for b in batches for i in b[-1].tolist()]


def test_readme_loop_resumed_with_set_epoch_trains_each_sample_once(store: Path) -> None:
    epochs = 2
    with Loader(store, 4, shuffle=True, **UINT8) as loader:
        full = [indices_of(list(loader)) for _ in range(epochs)]
    with Loader(store, 4, shuffle=True, **UINT8) as loader:
        first = []
        for n, batch in enumerate(loader):
            first += batch[-1].tolist()
            if n == 5:
                state = loader.state_dict()
                break
    with Loader(store, 4, shuffle=True, **UINT8) as loader:
        loader.load_state_dict(state)
        seen = []
        for epoch in range(state["epoch"], epochs):  # the README's loop, as a user resumes it
            loader.set_epoch(epoch)
            seen.append([i for batch in loader for i in batch[-1].tolist()])
    assert first + seen[0] == full[0]  # the rest of epoch 0, nothing twice
    assert seen[1] == full[1]


def test_set_epoch_of_another_epoch_starts_it_fresh(store: Path) -> None:
    with Loader(store, 4, **UINT8) as loader:
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        it.close()
    with Loader(store, 4, **UINT8) as loader:
        loader.load_state_dict(state)
        loader.set_epoch(3)
        assert loader.next_epoch_indices().tolist() == loader.epoch_indices(3).tolist()


def _simulate(store: StoreReader, first: tuple[int, int, bool], second: tuple[int, int], shuffle: str,
              stop: int) -> tuple[Counter[int], int, int]:
    """Ranks of one job in one process, each a running Loader: ``stop`` batches at (world, batch,
    drop_last), then the state of rank 0 resumed at another (world, batch) to the epoch's end.
    Returns delivery counts and the settings of the job that finished the epoch (whose drop_last
    or padding rule applies)."""
    world1, batch1, drop_last = first
    world2, batch2 = second
    counts: Counter[int] = Counter()
    saved = []
    finished_first = False
    for rank in range(world1):
        with Loader(store, batch1, shuffle=shuffle, drop_last=drop_last, rank=rank, world_size=world1,
                    seed=3, **UINT8) as loader:
            done = min(stop, len(loader))
            finished_first = done == len(loader)
            batches = iter(loader)
            for _ in range(done):
                counts.update(next(batches)[-1].tolist())
            saved.append(loader.state_dict())  # mid-epoch, as a job stopped here saves it
    assert all(s == saved[0] for s in saved[1:]) or world1 == 1  # any one rank's state is enough
    for rank in range(world2):
        with Loader(store, batch2, shuffle=shuffle, drop_last=drop_last, rank=rank, world_size=world2,
                    seed=3, **UINT8) as resumed:
            resumed.load_state_dict(json.loads(json.dumps(saved[0])))  # JSON-able, as promised
            counts.update(indices_of(list(resumed)))
    return counts, *((world1, batch1) if finished_first else (world2, batch2))


@pytest.mark.parametrize("shuffle", [s.value for s in Shuffle])
def test_elastic_resume_over_world_and_batch_sizes_is_exactly_once(store: Path, shuffle: str) -> None:
    reader = StoreReader(store)
    n = len(reader)
    cases = 0
    for world1, batch1, drop_last in itertools.product(range(1, 5), (7, 16, 64), (False, True)):
        others = ((world1 % 4 + 1, 16 if batch1 != 16 else 7), (world1, 64 if batch1 != 64 else 7))
        for world2, batch2 in others:
            for stop in (1, 2):
                counts, w, b = _simulate(reader, (world1, batch1, drop_last), (world2, batch2), shuffle, stop)
                case = (world1, batch1, drop_last, world2, batch2, stop)
                never = n - len(counts)
                repeats = sum(counts.values()) - len(counts)
                if drop_last:
                    assert repeats == 0 and never < w * b, case
                else:
                    assert never == 0 and repeats < w, case
                cases += 1
    assert cases == 4 * 3 * 2 * 2 * 2


def test_a_state_of_another_store_seed_or_subset_is_refused(store: Path) -> None:
    with Loader(store, 4, seed=1) as loader:
        state = loader.state_dict()
    with pytest.raises(ValueError, match="seed=1"):
        Loader(store, 4, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="shuffle="):
        Loader(store, 4, seed=1, shuffle="shard").load_state_dict(state)
    with pytest.raises(ValueError, match="subset="):
        Loader(store, 4, seed=1, indices=range(10)).load_state_dict(state)


@pytest.mark.parametrize("shuffle", [True, False, *(s.value for s in Shuffle), Shuffle.SHARD])
def test_options_become_members_and_a_state_holds_plain_strings(store: Path, tmp_path: Path,
                                                                 shuffle: bool | str) -> None:
    """A string option is its enum member inside; the state holds plain values only, so JSON,
    pickle and torch.load(weights_only=True) read it as before."""
    member = Shuffle.GLOBAL if shuffle is True else Shuffle.NONE if shuffle is False else Shuffle(shuffle)
    with Loader(store, 4, shuffle=shuffle, seed=1, dtype=torch.uint8, layout="channels_last") as loader:
        assert loader.shuffle is member and loader.layout is Layout.CHANNELS_LAST
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        it.close()
    assert state["shuffle"] == member.value and state["window"] == (4 if member is Shuffle.SHARD else None)
    assert_plain(state, "state_dict")
    assert b"Shuffle" not in pickle.dumps(state)  # a member would be pickled by its class
    torch.save({"loader": state}, tmp_path / "state.pth")
    assert torch.load(tmp_path / "state.pth", weights_only=True)["loader"] == state
    with Loader(store, 4, shuffle=member, seed=1) as loader:
        loader.load_state_dict(json.loads(json.dumps(state)))  # a member and its string are one setting


def test_a_bad_shuffle_or_layout_is_refused_in_the_same_words(store: Path) -> None:
    with pytest.raises(ValueError, match=r"^shuffle must be True, False or one of global, shard, none, "
                                         r"got 'random'$"):
        Loader(store, 4, shuffle="random")
    with pytest.raises(ValueError, match=r"^layout must be one of NCHW, NHWC, channels_last, got 'CHW'$"):
        Loader(store, 4, layout="CHW")


def test_a_state_of_another_version_is_refused_with_what_to_do(store: Path) -> None:
    with Loader(store, 4, seed=1) as loader:
        state = loader.state_dict()
        assert state["version"] == STATE_VERSION == 10
        loader.load_state_dict(json.loads(json.dumps(state)))  # its own version loads
        # what tilefeed wrote before the order changed: version 2, and version 1 without segments;
        # version 3, before sizes could change between epochs; version 4, before mixtures
        older = dict(state, version=2, segments=[[1, 4, False, 3]], batch=3)
        first = {k: v for k, v in older.items() if k != "segments"} | {"version": 1}
        unmarked = {k: v for k, v in state.items() if k != "version"}
        sizeless = {k: v for k, v in state.items() if k not in ("size", "set_size", "mixture")} | {"version": 3}
        unmixed = {k: v for k, v in state.items() if k != "mixture"} | {"version": 4}
        plain = {k: v for k, v in state.items() if k != "recipe"} | {"version": 5}  # before recipes
        untargeted = {k: v for k, v in state.items() if k not in ("targets", "targets_layout")} | {"version": 6}
        unfilled = dict(state, version=7)  # before a recipe named its fill
        unsolarized = dict(state, version=8)  # before a recipe could solarize
        captionless = {k: v for k, v in state.items() if k not in ("text", "fields")} | {"version": 9}
        for saved, says in ((older, "2"), (first, "1"), (sizeless, "3"), (unmixed, "4"), (plain, "5"),
                            (untargeted, "6"), (unfilled, "7"), (unsolarized, "8"), (captionless, "9"),
                            (dict(state, version=11), "11"),
                            (unmarked, "None")):
            with pytest.raises(ConfigError) as refused:
                loader.load_state_dict(saved)
            message = str(refused.value)
            assert "\n" not in message
            assert f"state_dict is version {says}, this Loader reads version 10" in message
            assert "start the epoch afresh" in message and "tilefeed that saved it" in message
        assert loader.next_epoch_indices().tolist() == loader.epoch_indices(0).tolist()  # nothing loaded


def test_a_damaged_state_is_refused_in_one_line(store: Path) -> None:
    with Loader(store, 4) as loader:
        state = loader.state_dict()
        for segments in ([[0, 4, False, 1]], [[2, 0, False, 1]], [[2, 4, False, -1]], [[2, 4]], ["x"]):
            with pytest.raises(ConfigError, match="state_dict"):
                loader.load_state_dict(dict(state, segments=segments))


def test_resume_through_torch_save_gives_the_same_batches_bit_for_bit(store: Path, tmp_path: Path) -> None:
    opts = dict(shuffle=True, seed=7, train=True, size=24, with_index=True, num_workers=2)
    with Loader(store, 8, **opts) as loader:
        uninterrupted = [[(b[0].clone(), b[1].clone(), b[2].clone()) for b in loader] for _ in range(2)]
    model = torch.nn.Linear(3, 2)
    with Loader(store, 8, **opts) as loader:
        got = []
        for n, batch in enumerate(loader):
            got.append(batch)
            if n == 2:
                torch.save({"model": model.state_dict(), "loader": loader.state_dict(), "epoch": 0},
                           tmp_path / "checkpoint.pth")
                break
    checkpoint = torch.load(tmp_path / "checkpoint.pth")
    with Loader(store, 8, **opts) as loader:
        loader.load_state_dict(checkpoint["loader"])
        resumed = []
        for epoch in range(checkpoint["epoch"], 2):
            loader.set_epoch(epoch)
            resumed.append(list(loader))
    assert len(got) + len(resumed[0]) == len(uninterrupted[0])
    for a, b in zip(got + resumed[0] + resumed[1], uninterrupted[0] + uninterrupted[1], strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_crops_are_a_function_of_the_sample_whatever_the_world_size(store: Path) -> None:
    opts = dict(shuffle=True, seed=7, train=True, size=24, with_index=True, num_workers=1)
    with Loader(store, 8, **opts) as loader:
        single = {int(i): img for imgs, _, idx in loader for img, i in zip(imgs, idx, strict=True)}
    for rank in range(3):
        with Loader(store, 5, rank=rank, world_size=3, **opts) as loader:
            for imgs, _, idx in loader:
                for img, i in zip(imgs, idx.tolist(), strict=True):
                    assert torch.equal(img, single[i]), i


# -- DataLoader arguments -------------------------------------------------------------------------
def test_dataloader_keywords_work_and_defaults_do_not_augment(store: Path) -> None:
    reader = StoreReader(store)
    loader = Loader(store, np.int64(8), shuffle=False, num_workers=np.int32(2), pin_memory=True,
                    prefetch_factor=3, persistent_workers=True, drop_last=True, with_index=True,
                    dtype=torch.uint8, layout="NHWC")
    assert (loader.workers, loader.prefetch, loader.shuffle) == (2, 3, "none")
    images, _, idx = next(iter(loader))
    assert images.shape == (8, 32, 32, 3)  # size defaults to the tile side, no augmentation
    assert torch.equal(images[0], torch.from_numpy(reader.read(int(idx[0]))))
    assert len(loader.dataset) == 50 and len(loader) == 6
    loader.sampler.set_epoch(4)
    assert loader.next_epoch_indices().tolist() == loader.epoch_indices(4).tolist()
    with pytest.raises(ValueError, match="num_workers or workers"):
        Loader(store, 8, num_workers=2, workers=2)
    with pytest.raises(TypeError, match="unexpected keyword"):
        Loader(store, 8, shufle=True)


def test_options_without_effect_warn_once(store: Path) -> None:
    import tilefeed.pipeline.settings as loader_module

    loader_module._warned.discard("collate_fn")
    with pytest.warns(UserWarning, match="collate_fn"):
        Loader(store, 8, collate_fn=lambda b: b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Loader(store, 8, collate_fn=lambda b: b)


def test_evaluation_framing_matches_resize_then_centre_crop(store: Path) -> None:
    reader = StoreReader(store)
    with Loader(store, 4, shuffle=False, size=24, dtype=torch.uint8, layout="NHWC",
                with_index=True) as loader:
        images, _, idx = next(iter(loader))
    side = int(24 / 0.875)  # 27: torchvision's Resize(size / crop_pct), then CenterCrop(size)
    for image, i in zip(images, idx.tolist(), strict=True):
        tile = torch.from_numpy(reader.read(i)).permute(2, 0, 1)[None].float()
        resized = torch.nn.functional.interpolate(tile, size=(side, side), mode="bilinear",
                                                  antialias=True, align_corners=False)
        top = int(round((side - 24) / 2))
        expected = resized[0, :, top : top + 24, top : top + 24].permute(1, 2, 0)
        assert (image.float() - expected).abs().mean() < 2.0


def test_a_subset_is_an_epoch_of_its_own_with_resume(store: Path) -> None:
    subset = list(range(0, 50, 3))
    with Loader(store, 4, indices=subset, **UINT8) as loader:
        assert len(loader) == 5 and len(loader.dataset) == 17
        epoch = indices_of(list(loader))
        assert sorted(epoch) == subset
        it = iter(loader)
        first = [i for _ in range(2) for i in next(it)[-1].tolist()]
        state = loader.state_dict()
        it.close()
    with Loader(store, 3, indices=subset, rank=1, world_size=2, **UINT8) as a, \
            Loader(store, 3, indices=subset, rank=0, world_size=2, **UINT8) as b:
        a.load_state_dict(state)
        b.load_state_dict(state)
        rest = indices_of(list(a)) + indices_of(list(b))
    counts = Counter(first + rest)
    assert set(counts) == set(subset) and sum(counts.values()) - len(counts) < 2


# -- the ledger and `tilefeed audit` ---------------------------------------------------------------
def test_ledger_and_audit_on_a_clean_run_and_an_injected_duplicate(store: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    for rank in range(2):
        with Loader(store, 4, rank=rank, world_size=2, ledger=ledger, **UINT8) as loader:
            for _ in range(2):
                list(loader)
    results = audit(ledger)
    assert [(r.epoch, r.once, r.never, r.ok, r.complete) for r in results] == [(0, 50, 0, True, True)] * 1 + [
        (1, 50, 0, True, True)]
    r = run_cli("audit", str(ledger))
    assert r.returncode == 0 and "ok" in r.stdout
    size = sum(p.stat().st_size for p in ledger.rglob("*.ledger"))
    assert size < 2000  # compact: sorted ids, delta-coded
    # a rank that handed some samples over twice: a third "run" re-delivering rank 0's first batch
    with Loader(store, 4, rank=0, world_size=2, ledger=ledger, **UINT8) as loader:
        it = iter(loader)
        next(it)
        loader.state_dict()
        it.close()
    r = run_cli("audit", str(ledger))
    assert r.returncode == 1 and "FAIL: 4 delivered more than once" in r.stdout


def test_a_whole_store_ledger_records_a_count_and_a_subset_its_ids(store: Path, tmp_path: Path) -> None:
    whole, part = tmp_path / "whole", tmp_path / "part"
    with Loader(store, 4, ledger=whole, **UINT8) as loader:
        list(loader)
    assert json.loads((whole / COUNT).read_text()) == {"samples": 50}  # no id per sample
    assert not (whole / POPULATION).exists()
    subset = list(range(1, 50, 3))
    with Loader(store, 4, ledger=part, indices=subset, **UINT8) as loader:
        list(loader)
    assert _unpack((part / POPULATION).read_bytes()).tolist() == subset and not (part / COUNT).exists()
    assert [(r.population, r.once, r.twice, r.never, r.ok) for r in audit(whole)] == [(50, 50, 0, 0, True)]
    assert [(r.population, r.once, r.twice, r.never, r.ok) for r in audit(part)] == [(17, 17, 0, 0, True)]
    (whole / POPULATION).write_bytes((part / POPULATION).read_bytes())
    with pytest.raises(LedgerError, match="holds both"):
        audit(whole)


def _reference_tally(size: int, records: list[np.ndarray]) -> tuple[int, int, int, int, list[int], list[int]]:
    counts = Counter(int(i) for r in records for i in r)
    twice = sorted(i for i, c in counts.items() if c > 1)
    never = [i for i in range(min(size, len(counts) + 5)) if i not in counts][:5]
    return (sum(c == 1 for c in counts.values()), len(twice), size - len(counts),
            sum(counts.values()) - len(counts), twice[:5], never)


def test_the_audit_tally_counts_as_a_table_of_every_sample_would() -> None:
    rng = np.random.default_rng(0)
    paths = set()
    for case in range(300):
        size = int(rng.choice([1, 7, 64, 1000, 5000, 10**6, 10**12]))
        records = []
        for _ in range(int(rng.integers(0, 6))):
            length = int(rng.integers(0, 300))
            high = min(size, 2000) if case % 2 else size  # dense repeats, or ids spread wide
            ids = rng.integers(0, high, size=length)
            records.append(np.sort(ids))
        tally = _Tally(size)
        for r in records:
            tally.add(r)
        paths.add(tally.bits is not None)
        distinct, twice = tally.distinct(), tally.twice()
        got = (distinct - twice, twice, size - distinct, tally.deliveries - distinct,
               tally.examples_twice().tolist(), tally.examples_never().tolist())
        assert got == _reference_tally(size, records), (size, case)
    assert paths == {True, False}  # both the sorted arrays and the bitmaps were checked


def test_the_audit_of_a_huge_store_is_sized_by_what_was_delivered(tmp_path: Path) -> None:
    from tilefeed.pipeline.audit.ledger import Ledger

    ledger = Ledger(tmp_path, rank=0, population=None, samples=10**12)
    ledger.record(0, np.arange(10**12 - 4, 10**12), world_size=1, batch_size=4, drop_last=False, complete=False)
    [epoch] = audit(tmp_path)  # a table of 10**12 samples would not fit this machine
    assert (epoch.once, epoch.never, epoch.examples_never) == (4, 10**12 - 4, [0, 1, 2, 3, 4])


def _killed_after_checkpoint(store: str, ledger: str, state_file: str) -> None:
    train_until_killed(Loader(store, 4, rank=0, world_size=2, ledger=ledger, **UINT8), state_file)


@pytest.mark.slow
def test_audit_across_a_kill_and_an_elastic_resume(store: Path, tmp_path: Path) -> None:
    ledger, state_file = tmp_path / "ledger", tmp_path / "state.json"
    code = (f"from tests.pipeline.loader.test_resume import _killed_after_checkpoint; "
            f"_killed_after_checkpoint({str(store)!r}, {str(ledger)!r}, {str(state_file)!r})")
    epoch = killed_and_resumed(lambda batch, rank, world: Loader(store, batch, rank=rank, world_size=world,
                                                                 ledger=ledger, **UINT8),
                               code, ledger, state_file)
    assert epoch.complete and epoch.ok and epoch.never == 0 and epoch.runs == 5


# -- a real 2-process job resumed as a 3-process job ------------------------------------------------
def _job(rank: int, world: int, port: int, store: str, state_file: str, out: str) -> None:
    join_gloo(rank, world, port)
    with Loader(store, 4 if world == 2 else 3, shuffle="shard", **UINT8) as loader:
        delivered = []
        if world == 2:
            for n, batch in enumerate(loader):
                delivered += batch[-1].tolist()
                if n == 3:
                    if rank == 0:
                        torch.save({"loader": loader.state_dict()}, state_file)
                    break
        else:
            loader.load_state_dict(torch.load(state_file)["loader"])
            for epoch in range(loader.state_dict()["epoch"], 1):
                loader.set_epoch(epoch)
                delivered += [i for batch in loader for i in batch[-1].tolist()]
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, delivered)
    if rank == 0:
        torch.save(gathered, out)
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_process_job_resumed_on_three_processes(store: Path, tmp_path: Path) -> None:
    state, first, second = tmp_path / "state.pt", tmp_path / "a.pt", tmp_path / "b.pt"
    for world, out in ((2, first), (3, second)):
        mp.start_processes(_job, args=(world, free_port(), str(store), str(state), str(out)),
                           nprocs=world, join=True, start_method="spawn")
    delivered = [i for part in torch.load(first) + torch.load(second) for i in part]
    counts = Counter(delivered)
    assert set(counts) == set(range(50)) and len(delivered) - 50 < 3


def test_a_ledger_epoch_of_imagenet_size_stays_near_a_megabyte() -> None:
    from tilefeed.pipeline.audit.ledger import _pack, _unpack

    order = np.random.default_rng(0).permutation(1_281_167)
    packed = [_pack(order[rank::8]) for rank in range(8)]  # 8 ranks' shares of one epoch
    assert sum(map(len, packed)) < 1.5 * 2**20  # measured: 1.04 MiB
    np.testing.assert_array_equal(_unpack(packed[3]), np.sort(order[3::8]))
