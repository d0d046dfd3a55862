"""Captions, tokens and fields out of the Loader: each sample's by its picture's key, exactly once
an epoch over ranks, the weighted pick drawn from (seed, epoch, sample) alone and replayed by a
resumed epoch, the tokenizer on a reader thread, and a one-line refusal for what a store lacks."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tilefeed.pipeline import Loader, Mix, StoreReader
from tilefeed.pipeline.loader.pairs import pick
from tilefeed.pipeline.options import TextChoice, parse_text
from tilefeed.pipeline.reading.reader import source_paths
from tilefeed.store.errors import ConfigError
from tests.helpers import DEVICE_SIDES, caption_of, device_sides, make_pairs_store, on_side

SAMPLES = 24


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pairs_store(tmp_path_factory.mktemp("pairs"), SAMPLES)


def keys_of(store: Path, ids: torch.Tensor) -> list[str]:
    """The source file name of each sample: the key its captions were written under."""
    with StoreReader(store) as reader:
        return [Path(p).name for p in source_paths(reader, ids.numpy())]


def number(key: str) -> int:
    return int(key.split(".")[0])


def test_captions_and_fields_follow_their_picture_by_key(store: Path) -> None:
    seen: list[int] = []
    for rank in range(2):
        loader = Loader(store, 5, text="caption", fields=("uid", "score", "width"), with_index=True, seed=3,
                        rank=rank, world_size=2, size=32)
        for images, texts, fields, ids in loader:
            keys = keys_of(store, ids)
            assert images.shape[1:] == (3, 32, 32)
            assert texts == [caption_of(k) for k in keys]
            assert fields["uid"] == [f"u{number(k):04d}" for k in keys]
            assert fields["score"].dtype == torch.float64
            assert fields["score"].tolist() == [number(k) / 4 for k in keys]
            assert fields["width"].dtype == torch.int64
            assert fields["width"].tolist() == [40 + number(k) for k in keys]
            seen += ids.tolist()
    assert sorted(seen) == list(range(SAMPLES))  # every sample once over the two ranks


@pytest.mark.parametrize("side", [pytest.param("host"), *device_sides()])
def test_captions_tokens_and_fields_ride_with_their_images_in_every_graph_shape(store: Path, side: str) -> None:
    """The host shape, the GPU's graph on DALI's CPU backend, and CUDA itself (its side stream's
    hand-over): each batch's captions, tokens and fields are its own images' samples', on the
    host, while the images are on the Loader's device."""
    assert side == "host" or side in DEVICE_SIDES

    def tokenizer(texts: list[str]) -> torch.Tensor:
        return torch.tensor([[len(t)] for t in texts])

    seen: list[int] = []
    with on_side(side) as device:
        for train in (True, False):
            loader = Loader(store, 5, text="caption", tokenizer=tokenizer, fields=("uid",), with_index=True,
                            train=train, size=32, device=device)
            for images, tokens, fields, ids in loader:
                keys = keys_of(store, ids.cpu())
                assert images.device.type == torch.device(device).type and len(images) == len(ids)
                assert tokens.device.type == "cpu"
                assert tokens[:, 0].tolist() == [len(caption_of(k)) for k in keys]
                assert fields["uid"] == [f"u{number(k):04d}" for k in keys]
                seen += ids.tolist()
            loader.close()
    assert sorted(seen) == sorted(list(range(SAMPLES)) * 2)


def test_a_batch_is_images_and_texts_as_open_clip_unpacks_it(store: Path) -> None:
    loader = Loader(store, 8, text="caption", size=32)
    batch = next(iter(loader))
    assert len(batch) == 2 and isinstance(batch[1], list) and all(isinstance(t, str) for t in batch[1])
    # without text, an unlabelled store's batch holds its images alone; fields come after
    assert len(next(iter(Loader(store, 8, size=32)))) == 1
    images, fields = next(iter(Loader(store, 8, fields="uid", size=32)))
    assert list(fields) == ["uid"]


def test_the_tokenizer_runs_on_a_reader_thread_on_the_picked_captions(store: Path) -> None:
    threads: set[str] = set()

    def tokenizer(texts: list[str]) -> torch.Tensor:
        threads.add(threading.current_thread().name)
        return torch.tensor([[len(t), sum(map(ord, t))] for t in texts])

    loader = Loader(store, 6, text="caption", tokenizer=tokenizer, with_index=True, size=32)
    for _, tokens, ids in loader:
        expected = [[len(c), sum(map(ord, c))] for c in (caption_of(k) for k in keys_of(store, ids))]
        assert tokens.tolist() == expected
    assert threads and threading.main_thread().name not in threads


def test_the_weighted_pick_takes_each_name_at_its_weight_and_falls_past_an_empty_one() -> None:
    count = 20_000
    texts = {"a": np.array([f"a{i}" for i in range(count)], dtype="T"),
             "b": np.array([f"b{i}" if i % 2 == 0 else "" for i in range(count)], dtype="T")}
    choice = TextChoice(("a", "b"), (3.0, 1.0))
    ids = np.arange(count)
    picked = pick(texts, choice, 7, 0, ids, ids)
    even = np.array([p.startswith("b") for p in picked[::2]])
    assert abs(even.mean() - 0.25) < 0.02  # weight 1 of 4 where both exist
    assert all(p.startswith("a") for p in picked[1::2])  # an empty pick falls to the next name
    assert picked == pick(texts, choice, 7, 0, ids, ids)  # a function of (seed, epoch, position)
    assert picked != pick(texts, choice, 7, 1, ids, ids)  # drawn anew each epoch
    assert picked != pick(texts, choice, 8, 0, ids, ids)


def test_a_resumed_epoch_carries_the_captions_the_interrupted_one_would_have(store: Path) -> None:
    options = dict(text={"caption": 1.0, "synthetic": 1.0}, fields=("uid",), with_index=True, seed=5, size=32)
    whole = [(t, f["uid"], i.tolist()) for _, t, f, i in Loader(store, 4, **options)]
    first = Loader(store, 4, **options)
    it = iter(first)
    got = [next(it) for _ in range(2)]
    state = first.state_dict()
    assert state["text"] == [["caption", "synthetic"], [1.0, 1.0]]
    resumed = Loader(store, 4, **options)
    resumed.load_state_dict(state)
    rest = [(t, f["uid"], i.tolist()) for _, t, f, i in resumed]
    assert [(t, f["uid"], i.tolist()) for _, t, f, i in got] + rest == whole
    assert any(t.startswith("synthetic") for batch in whole for t in batch[0])  # both names drawn
    other = Loader(store, 4, **{**options, "text": "caption"})
    with pytest.raises(ConfigError, match="text"):
        other.load_state_dict(state)


def test_a_mix_of_image_text_stores_carries_each_sample_s_own_captions(store: Path, tmp_path: Path) -> None:
    small = make_pairs_store(tmp_path, 10)
    loader = Loader(Mix({"big": store, "small": small}, weights={"big": 1, "small": 1}), 6, text="caption",
                    fields="uid", with_index=True, size=32)
    stores = {0: store, 1: small}
    drawn = set()
    for _, texts, fields, ids in loader:
        source, local = loader.reader.source_of(ids.numpy())
        for k, (s, i) in enumerate(zip(source.tolist(), local.tolist(), strict=True)):
            key = keys_of(stores[s], torch.tensor([i]))[0]
            assert texts[k] == caption_of(key) and fields["uid"][k] == f"u{number(key):04d}"
            drawn.add(s)
    assert drawn == {0, 1}


def test_what_a_store_lacks_is_refused_in_one_line(store: Path) -> None:
    for options, says in (({"labels": True}, "holds no class labels"),
                          ({"text": "nope"}, "holds no caption named 'nope' (it holds: caption, synthetic)"),
                          ({"fields": ("nope",)}, "holds no field 'nope'"),
                          ({"tokenizer": str.split}, "tokenizer needs text="),
                          ({"text": {"caption": 0}}, "one above 0"),
                          ({"text": "../x"}, "letters, digits and _"),
                          ({"text": "caption", "targets": "boxes"}, "cannot be asked together")):
        with pytest.raises(ConfigError) as refused:
            Loader(store, 4, **options)
        assert says in str(refused.value) and "\n" not in str(refused.value)


def test_parse_text_takes_a_name_or_weights() -> None:
    assert parse_text("caption") == TextChoice(("caption",))
    assert parse_text({"a": 2, "b": 0.5}) == TextChoice(("a", "b"), (2.0, 0.5))
    assert parse_text(None) is None
    with pytest.raises(ConfigError):
        parse_text({})


def test_where_keeps_the_samples_whose_fields_pass_exactly_once_over_ranks(store: Path, tmp_path: Path) -> None:
    ids_file = tmp_path / "subset.txt"
    ids_file.write_text("u0001\nu0004\n\nu0007\nu0010\nu0013\nu0016\nu0019\nu0022\nu9999\n")
    where = f"(score >= 0.5 and uid in file('{ids_file}')) or width == 40"
    expected = {0, 4, 7, 10, 13, 16, 19, 22}  # u0001 fails the score (0.25); u0000's width is 40
    seen: list[str] = []
    for rank in range(2):
        loader = Loader(store, 2, where=where, fields="uid", with_index=True, rank=rank, world_size=2, size=32)
        assert loader.sources.per_epoch == len(expected)
        for _, fields, ids in loader:
            assert fields["uid"] == [f"u{number(k):04d}" for k in keys_of(store, ids)]
            seen += fields["uid"]
    assert sorted(seen) == [f"u{i:04d}" for i in sorted(expected)]
    by_function = Loader(store, 4, where=lambda f: f["width"] % 3 == 0, fields="width", size=32)
    widths = sorted(w for _, f in by_function for w in f["width"].tolist())
    assert widths == [w for w in range(40, 64) if w % 3 == 0]


def test_an_epoch_resumed_under_where_on_another_world_size_delivers_the_rest_once(store: Path) -> None:
    options = dict(where="score > 1", text="caption", with_index=True, seed=2, size=32)
    first = Loader(store, 3, rank=0, world_size=2, **options)
    it = iter(first)
    done = [next(it)[2].tolist() for _ in range(2)]
    state = first.state_dict()
    # the other rank's first two batches were handed over too: a state speaks for every rank
    other = iter(Loader(store, 3, rank=1, world_size=2, **options))
    done += [next(other)[2].tolist() for _ in range(2)]
    resumed = Loader(store, 3, **options)  # one process now
    resumed.load_state_dict(state)
    rest = [i for _, texts, ids in resumed for i in ids.tolist()]
    delivered = sorted(i for batch in done for i in batch) + rest
    assert sorted(delivered) == [i for i in range(SAMPLES) if i / 4 > 1]
    refiltered = Loader(store, 3, **{**options, "where": "score > 2"})
    with pytest.raises(ConfigError) as refused:
        refiltered.load_state_dict(state)
    assert "\n" not in str(refused.value)


def test_where_refuses_what_it_cannot_evaluate_in_one_line(store: Path) -> None:
    for where, says in (("nope > 1", "holds no field 'nope'"), ("uid > 3", "compared with a number"),
                        ("score > 100", "keeps no sample"), ("__import__('os')", "not part of the expression"),
                        ("score + 1 > 2", "not part of the expression"),
                        ("uid in file('/nonexistent/ids.txt')", "cannot be read"),
                        (lambda f: [True], "boolean array")):
        with pytest.raises(ConfigError) as refused:
            Loader(store, 4, where=where)
        assert says in str(refused.value) and "\n" not in str(refused.value), refused.value


def test_a_resampled_mix_draws_the_same_on_any_world_size_and_after_resume(store: Path, tmp_path: Path) -> None:
    small = make_pairs_store(tmp_path, 10)
    mix = Mix({"big": store, "small": small}, weights={"big": 24 * 1, "small": 10 * 3}, epoch_samples=40,
              replacement=True)
    options = dict(text="caption", with_index=True, seed=4, size=32, shuffle=False)

    def delivered(world: int) -> list[int]:
        ids: list[int] = []
        for rank in range(world):
            ids += [i for _, _, b in Loader(mix, 5, rank=rank, world_size=world, **options) for i in b.tolist()]
        return sorted(ids)

    one = delivered(1)
    assert one == delivered(2) and len(one) == 40
    loader = Loader(mix, 5, **options)
    source, _ = loader.reader.source_of(np.array(one))
    assert np.bincount(source).tolist() == [18, 22]  # the weights' shares of 40, exactly: 24:30
    assert len(set(one)) < 40  # with replacement, a sample comes again
    loader.set_epoch(1)
    assert sorted(i for _, _, b in loader for i in b.tolist()) != one  # drawn anew each epoch
    first = Loader(mix, 5, **options)
    run = iter(first)
    head = [i for _ in range(3) for i in next(run)[2].tolist()]
    resumed = Loader(mix, 5, **options)
    resumed.load_state_dict(first.state_dict())
    assert sorted(head + [i for _, _, b in resumed for i in b.tolist()]) == one


def test_stats_say_how_many_samples_passed_where(store: Path) -> None:
    loader = Loader(store, 4, where="score >= 3", size=32)
    assert len(loader) == 3  # 12 samples pass, in batches of 4
    for _ in loader:
        pass
    stats = loader.stats()
    assert stats.selected == (12, SAMPLES) and "| samples that passed where= | 12 of 24 |" in str(stats)


def test_a_tokenizer_that_fails_or_miscounts_stops_the_epoch_in_one_line(store: Path) -> None:
    def raising(texts: list[str]) -> torch.Tensor:
        raise ValueError("boom\nsecond line")

    for tokenizer, says in ((raising, "the tokenizer raised ValueError on the batch from sample"),
                            (lambda texts: torch.zeros(len(texts) + 1, 4), "rows for 4 captions")):
        loader = Loader(store, 4, text="caption", tokenizer=tokenizer, size=32)
        with pytest.raises(ConfigError) as refused:
            next(iter(loader))
        assert says in str(refused.value) and "\n" not in str(refused.value), refused.value
        loader.close()


def test_the_tokenizer_is_never_called_by_two_threads_at_once(store: Path) -> None:
    inside, most = [0], [0]
    lock = threading.Lock()

    def tokenizer(texts: list[str]) -> torch.Tensor:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.01)  # long enough for another reader thread to arrive
        with lock:
            inside[0] -= 1
        return torch.zeros(len(texts), 2)

    loader = Loader(store, 2, text="caption", tokenizer=tokenizer, num_workers=4, size=32)
    assert sum(len(tokens) for _, tokens in loader) == SAMPLES
    assert most[0] == 1


def test_where_reads_datacomp_s_npy_subsets_and_refuses_what_is_no_id_file(store: Path, tmp_path: Path) -> None:
    numbers = tmp_path / "widths.npy"
    np.save(numbers, np.array([40, 45, 63], dtype=np.int64))
    assert sorted(i for _, f in Loader(store, 4, where=f"width in file('{numbers}')", fields="width", size=32)
                  for i in f["width"].tolist()) == [40, 45, 63]
    uids = tmp_path / "uids.npy"  # DataComp's layout: each 128-bit uid as two uint64
    np.save(uids, np.array([(0, 1), (0xFFFF, 2)], dtype="u8,u8"))
    with pytest.raises(ConfigError, match="keeps no sample"):  # hex uids, none of this store's
        Loader(store, 4, where=f"uid in file('{uids}')")
    for where, says in (("uid in file('/dev/zero')", "not a plain file"),
                        ("width in [2**63]", "not part of the expression"),
                        ("width in [9223372036854775808]", "past int64"),
                        ("uid == -'x'", "not part of the expression"),
                        ("not " * 2400 + "width > 1", "nests too deeply")):
        with pytest.raises(ConfigError) as refused:
            Loader(store, 4, where=where)
        assert says in str(refused.value) and "\n" not in str(refused.value), (where[:40], refused.value)
    with pytest.raises(ConfigError, match="among the indices given"):
        Loader(store, 4, where="score > 3", indices=[0, 2, 4])
    with pytest.raises(ConfigError, match="labels=False with targets"):
        Loader(store, 4, labels=False, targets="boxes")


def test_text_in_priority_order_or_with_fallbacks_of_weight_zero() -> None:
    count = 4000
    texts = {"a": np.array(["" if i % 3 == 0 else f"a{i}" for i in range(count)], dtype="T"),
             "b": np.array([f"b{i}" for i in range(count)], dtype="T"),
             "c": np.array([f"c{i}" for i in range(count)], dtype="T")}
    ids = np.arange(count)
    ordered = pick(texts, parse_text(["a", "b"]), 0, 0, ids, ids)  # open_clip's --json-text-key a;b
    assert ordered == [f"b{i}" if i % 3 == 0 else f"a{i}" for i in range(count)]
    fallback = pick(texts, parse_text({"a": 1, "c": 0, "b": 0}), 0, 0, ids, ids)
    assert fallback == [f"c{i}" if i % 3 == 0 else f"a{i}" for i in range(count)]  # zeros in the order given
    with pytest.raises(ConfigError, match="one above 0"):
        parse_text({"a": 0})


def test_a_weighted_mix_with_tokens_resumes_on_another_world_size_exactly_once(store: Path,
                                                                               tmp_path: Path) -> None:
    small = make_pairs_store(tmp_path, 10)
    mix = Mix({"big": store, "small": small}, weights={"big": 2, "small": 1}, epoch_samples=30)

    def tokenizer(texts: list[str]) -> torch.Tensor:
        return torch.tensor([[sum(map(ord, t))] for t in texts])

    options = dict(text={"caption": 1.0, "synthetic": 1.0}, tokenizer=tokenizer, with_index=True, seed=6,
                   size=32)
    whole = sorted((i, int(t)) for _, tokens, ids in Loader(mix, 3, **options)
                   for i, t in zip(ids.tolist(), tokens[:, 0].tolist(), strict=True))
    done = []
    for rank in range(2):
        it = iter(Loader(mix, 3, rank=rank, world_size=2, **options))
        for _ in range(2):
            _, tokens, ids = next(it)
            done += list(zip(ids.tolist(), tokens[:, 0].tolist(), strict=True))
    first = Loader(mix, 3, rank=0, world_size=2, **options)
    run = iter(first)
    for _ in range(2):
        next(run)
    resumed = Loader(mix, 3, **options)  # one process now
    resumed.load_state_dict(first.state_dict())
    rest = [(i, int(t)) for _, tokens, ids in resumed for i, t in zip(ids.tolist(), tokens[:, 0].tolist(),
                                                                       strict=True)]
    assert sorted(done + rest) == whole  # each position once, with the caption drawn for it


def test_the_front_door_refusals_hold_for_image_text_batches(store: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A Loader of captions meets accelerate's ``skip_first_batches`` and a launcher's world size
    as an image Loader does: refused (the reason on the error's last line), never raw tiles or
    every sample on every rank; then it runs, every caption with its picture."""
    from accelerate.data_loader import skip_first_batches

    from tilefeed.pipeline.loader.dataloader_face import ITEMS_REFUSED

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with Loader(store, 8, text="caption", with_index=True, workers=1) as loader:
        skipped = skip_first_batches(loader, 1)
        skipped.num_workers = 0  # in this process (the workers' road: test_dataloader_face)
        with pytest.raises(ConfigError) as caught:
            next(iter(skipped))
        assert str(caught.value).splitlines()[-1].endswith(ITEMS_REFUSED)
        monkeypatch.setenv("WORLD_SIZE", "2")
        with pytest.raises(ConfigError, match="the job runs 2 processes"):
            next(iter(loader))
        monkeypatch.setenv("WORLD_SIZE", "1")
        batches = list(loader)
    ids = torch.cat([b[-1] for b in batches])
    assert sorted(ids.tolist()) == list(range(SAMPLES))
    assert [caption_of(k) for k in keys_of(store, ids)] == [t for b in batches for t in b[1]]
