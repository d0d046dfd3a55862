from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.helpers import write_folder
from tilefeed.pipeline.reading.mixed import (
    LABEL_RULES,
    LabelRule,
    MixedArray,
    MixedReader,
    RemoteCaches,
    combine_labels,
)
from tilefeed.pipeline.reading.reader import StoreReader
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tilefeed.store.errors import ConfigError

# name: (codec, classes, per class, tile, shard size, fit, quality); seeds differ, so do pixels
STORES: dict[str, tuple[str, int, int, int, int, str, int]] = {
    "a": ("lz4", 5, 4, 32, 8, "pad", 90),  # 20 samples, padded
    "b": ("lz4", 5, 6, 32, 5, "crop", 90),  # 30 samples
    "few": ("lz4", 3, 3, 32, 8, "crop", 90),  # classes c0..c2
    "zstd": ("zstd", 5, 2, 32, 8, "crop", 90),
    "small": ("lz4", 5, 2, 16, 8, "crop", 90),
    "jpeg90": ("jpeg", 5, 2, 32, 8, "crop", 90),
    "jpeg60": ("jpeg", 5, 3, 32, 4, "pad", 60),
}


@pytest.fixture(scope="module")
def readers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, StoreReader]]:
    opened: dict[str, StoreReader] = {}
    for seed, (name, (codec, classes, per_class, tile, shard, fit, quality)) in enumerate(STORES.items()):
        root = tmp_path_factory.mktemp(name)
        src = write_folder(root / "src", classes=classes, per_class=per_class, size=(48, 40), seed=seed)
        preprocess(src, root / "store", TileSettings(tile=tile, fit=fit),
                   StoreSettings(codec=codec, quality=quality, shard_size=shard), workers=1)
        opened[name] = StoreReader(root / "store")
    yield opened
    for reader in opened.values():
        reader.close()


def mix(readers: dict[str, StoreReader], *names: str, labels: str = "same") -> MixedReader:
    return MixedReader([readers[n] for n in names], list(names), labels)


def batch_orders(sizes: tuple[int, ...]) -> list[np.ndarray]:
    """Global ids in the orders a Loader reads: interleaved at random, source after source,
    backwards, one source alone, repeats."""
    total = sum(sizes)
    rng = np.random.default_rng(3)
    return [rng.permutation(total), np.arange(total), np.arange(total)[::-1].copy(),
            np.arange(sizes[0], total), rng.integers(0, total, 40), np.array([sizes[0], 0, sizes[0], 0])]


def expected(readers: dict[str, StoreReader], names: tuple[str, ...], ids: np.ndarray) -> list[tuple[str, int]]:
    ends = np.cumsum([len(readers[n]) for n in names])
    out = []
    for i in ids.tolist():
        s = int(np.searchsorted(ends, i, side="right"))
        out.append((names[s], i - (int(ends[s - 1]) if s else 0)))
    return out


def test_global_ids_map_to_their_source_and_sample(readers: dict[str, StoreReader]) -> None:
    mixed = mix(readers, "a", "b")
    assert len(mixed) == mixed.samples == 50 and mixed.offsets == (0, 20) and mixed.sizes == (20, 30)
    ids = np.random.default_rng(0).permutation(50)
    sources, samples = mixed.source_of(ids)
    assert sources.dtype == samples.dtype == np.int64
    assert [(mixed.names[s], i) for s, i in zip(sources.tolist(), samples.tolist(), strict=True)] \
        == expected(readers, ("a", "b"), ids)
    grid, local = mixed.source_of(np.array([[0, 19], [20, 49]]))
    assert grid.tolist() == [[0, 0], [1, 1]] and local.tolist() == [[0, 19], [0, 29]]
    for bad in (50, -1):
        with pytest.raises(IndexError, match=f"sample {bad} is out of range for 50 samples"):
            mixed.source_of([3, bad])
    assert mixed.source_of([])[0].shape == (0,)


def test_the_store_surface_of_a_mixture(readers: dict[str, StoreReader]) -> None:
    mixed = mix(readers, "a", "b")
    assert mixed.tile == 32 and mixed.codec == readers["a"].codec and not mixed.is_image_coded
    assert mixed.shard_size == 5  # the smallest source's
    assert mixed.padded and readers["a"].padded and not readers["b"].padded
    assert mixed.classes == readers["a"].classes and mixed.remote is None
    assert mixed.locations == (readers["a"].location, readers["b"].location)
    assert mixed.location == f"mixture of a ({readers['a'].location}), b ({readers['b'].location})"
    with MixedReader([readers["b"]], ["b"]) as alone:  # closing drops maps; a source reads on
        assert len(alone) == 30 and alone.shard_size == 5
    np.testing.assert_array_equal(readers["b"].read(3), alone.read(3))


@pytest.mark.parametrize("names", [("a", "b"), ("b", "a"), ("jpeg90", "jpeg60")])
def test_reads_equal_each_stores_own(readers: dict[str, StoreReader], names: tuple[str, str]) -> None:
    mixed = mix(readers, *names)
    sizes = (len(readers[names[0]]), len(readers[names[1]]))
    for ids in batch_orders(sizes):
        where = expected(readers, names, ids)
        payloads = mixed.payloads(ids.tolist())
        assert [bytes(p) for p in payloads] == [bytes(readers[n].payloads([i])[0]) for n, i in where]
        out = np.full((len(ids), 32, 32, 3), 7, dtype=np.uint8)
        assert mixed.read_batch_into(ids.tolist(), out, fast_idct=True) is out
        for k, (n, i) in enumerate(where):
            one = readers[n].read_batch_into([i], np.empty((1, 32, 32, 3), np.uint8), fast_idct=True)
            np.testing.assert_array_equal(out[k], one[0])
        assert mixed.stored_nbytes(ids) == sum(readers[n].stored_nbytes(np.array([i])) for n, i in where)
    last = sizes[0] + sizes[1] - 1
    np.testing.assert_array_equal(mixed.read(last), readers[names[1]].read(sizes[1] - 1))
    tile = np.empty((32, 32, 3), np.uint8)
    assert np.shares_memory(mixed.read_into(0, tile), tile)  # decoded in place, as StoreReader does
    np.testing.assert_array_equal(tile, readers[names[0]].read(0))
    assert mixed.payloads([]) == []
    assert mixed.read_batch_into([], np.empty((0, 32, 32, 3), np.uint8)).shape[0] == 0


def test_labels_and_boxes_gather_by_global_id(readers: dict[str, StoreReader]) -> None:
    mixed = mix(readers, "a", "b")
    a, b = readers["a"], readers["b"]
    whole_labels = np.concatenate([a.labels, b.labels])  # the reference, in the test only
    whole_boxes = np.concatenate([a.boxes, b.boxes])
    assert mixed.labels.shape == (50,) and len(mixed.boxes) == 50 and mixed.boxes.shape == (50, 4)
    assert mixed.labels.dtype == np.int64 and mixed.boxes.ndim == 2
    for ids in batch_orders((20, 30)):
        np.testing.assert_array_equal(mixed.labels[ids], whole_labels[ids])
        np.testing.assert_array_equal(mixed.boxes[ids], whole_boxes[ids])
    top, left, height, width = mixed.boxes[np.array([0, 25])].T  # as crops.window_inputs reads them
    assert height.tolist() == whole_boxes[[0, 25], 2].tolist()
    assert mixed.labels[23] == whole_labels[23] and isinstance(mixed.labels[23], np.integer)
    np.testing.assert_array_equal(mixed.boxes[21], whole_boxes[21])
    np.testing.assert_array_equal(mixed.labels[-1], whole_labels[-1])
    np.testing.assert_array_equal(mixed.boxes[15:25], whole_boxes[15:25])
    mask = np.arange(50) % 3 == 0
    np.testing.assert_array_equal(mixed.labels[mask], whole_labels[mask])
    np.testing.assert_array_equal(mixed.labels[[[1, 30], [40, 2]]], whole_labels[[[1, 30], [40, 2]]])
    assert mixed.labels[[]].shape == (0,) and mixed.boxes[np.array([], np.int64)].shape == (0, 4)
    for bad in (50, -51):
        with pytest.raises(IndexError, match=f"index {bad} is out of bounds for 50 samples"):
            mixed.labels[[0, bad]]
    with pytest.raises(IndexError, match="integers"):
        mixed.labels[np.array([1.5])]


def test_no_full_size_copy_of_labels_or_boxes(readers: dict[str, StoreReader]) -> None:
    mixed = mix(readers, "a", "b")
    for view, arrays in ((mixed.labels, [r.labels for r in mixed.sources]),
                         (mixed.boxes, [r.boxes for r in mixed.sources])):
        assert isinstance(view, MixedArray)
        assert all(part is array for part, array in zip(view.parts, arrays, strict=True))
        assert vars(view).keys() == {"parts", "lookups", "_ends", "_starts", "shape", "dtype"}
        assert sum(v.nbytes for v in (view._ends, view._starts)) == 2 * 8 * len(mixed.sources)
        with pytest.raises(TypeError, match="not copied whole"):
            np.asarray(view)
    assert mixed.labels.lookups is not None and all(len(m) == 5 for m in mixed.labels.lookups)


def test_combine_labels_rules() -> None:
    same = combine_labels([["x", "y"], ["x", "y"]], ["p", "q"])
    assert same[0] == ["x", "y"] and [m.tolist() for m in same[1]] == [[0, 1], [0, 1]]
    offset = combine_labels([["x", "y"], ["y", "z", "x"]], ["p", "q"], "offset")
    assert offset[0] == ["p/x", "p/y", "q/y", "q/z", "q/x"]
    assert [m.tolist() for m in offset[1]] == [[0, 1], [2, 3, 4]]
    names = combine_labels([["x", "y"], ["y", "z", "x"], []], ["p", "q", "r"], "names")
    assert names[0] == ["x", "y", "z"] and [m.tolist() for m in names[1]] == [[0, 1], [1, 2, 0], []]
    assert all(m.dtype == np.int64 for m in names[1])
    with pytest.raises(ConfigError, match="labels must be one of same, offset, names, got 'union'"):
        combine_labels([["x"]], ["p"], "union")
    with pytest.raises(ValueError, match="same length"):
        combine_labels([["x"]], ["p", "q"])


def test_a_rule_given_as_a_member_or_a_string_combines_alike(readers: dict[str, StoreReader]) -> None:
    assert LABEL_RULES == ("same", "offset", "names") and all(type(r) is str for r in LABEL_RULES)
    assert [r.value for r in LabelRule] == list(LABEL_RULES) and LabelRule.OFFSET == "offset"
    classes = [["x", "y"], ["y", "z", "x"]]
    for rule in ("offset", "names"):
        by_name = combine_labels(classes, ["p", "q"], rule)
        by_member = combine_labels(classes, ["p", "q"], LabelRule(rule))
        assert by_name[0] == by_member[0]
        assert [m.tolist() for m in by_name[1]] == [m.tolist() for m in by_member[1]]
        assert mix(readers, "few", "a", labels=rule).rule is LabelRule(rule)  # the reader keeps the member


def test_same_rule_refusal_names_both_lists_and_the_other_rules() -> None:
    with pytest.raises(ConfigError) as caught:
        combine_labels([["x", "y"], ["x", "y"], ["x", "w", "v"]], ["p", "q", "r"])
    message = str(caught.value)
    assert "\n" not in message
    assert message == ("the stores of a mixture must have the same classes under labels='same': 'p' "
                       "has ['x', 'y'], 'r' has ['x', 'w', 'v'] (first difference at class 1: 'y' and "
                       "'w'); labels='offset' keeps each store's classes apart, labels='names' merges "
                       "classes by name")
    long = [f"k{i}" for i in range(100)]
    with pytest.raises(ConfigError, match=r"'q' has 101 classes \['k0', .*'k7', \.\.\.\] \(first "
                                          r"difference at class 100: nothing and 'extra'\)"):
        combine_labels([long, [*long, "extra"]], ["p", "q"])


def test_mixed_labels_under_each_rule(readers: dict[str, StoreReader]) -> None:
    a, few = readers["a"], readers["few"]
    assert a.classes == ["c0", "c1", "c2", "c3", "c4"] and few.classes == ["c0", "c1", "c2"]
    with pytest.raises(ConfigError, match=r"'a' has \['c0', 'c1', 'c2', 'c3', 'c4'\], 'few' has \['c0', "
                                          r"'c1', 'c2'\] \(first difference at class 3"):
        mix(readers, "a", "few")
    ids = np.arange(len(a) + len(few))
    offset = mix(readers, "a", "few", labels="offset")
    assert offset.classes == [f"a/c{i}" for i in range(5)] + [f"few/c{i}" for i in range(3)]
    assert offset.labels[ids].tolist() == a.labels.tolist() + (few.labels + 5).tolist()
    assert offset.labels[ids[len(a):]].tolist() == (few.labels + 5).tolist()  # one source's ids
    assert offset.labels[len(a) + 1] == few.labels[1] + 5 and offset.labels[ids[len(a):]].dtype == np.int64
    merged = mix(readers, "few", "a", labels="names")
    assert merged.classes == ["c0", "c1", "c2", "c3", "c4"]
    assert merged.labels[ids].tolist() == few.labels.tolist() + a.labels.tolist()
    assert [merged.classes[k] for k in merged.labels[ids[-3:]].tolist()] == \
        [a.classes[k] for k in a.labels[-3:].tolist()]
    assert mix(readers, "a", "b").labels[ids].tolist() == (
        a.labels.tolist() + readers["b"].labels[: len(few)].tolist())


@pytest.mark.parametrize(("names", "message"), [
    (("a", "small"), "the stores of a mixture must share the tile side: 'a' has 32x32 tiles, 'small' has "
                     "16x16"),
    (("a", "jpeg90"), "a mixture cannot mix JPEG and lossless stores: 'a' is lz4, 'jpeg90' is jpeg (a graph "
                      "decodes one kind"),
    (("jpeg60", "b"), "a mixture cannot mix JPEG and lossless stores: 'jpeg60' is jpeg, 'b' is lz4"),
    (("a", "b", "zstd"), "the lossless stores of a mixture must share the codec: 'a' is lz4, 'zstd' is zstd "
                         "(tiles cut and resized on the host are decoded by one codec"),
])
def test_refused_mixtures(readers: dict[str, StoreReader], names: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        mix(readers, *names)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_names_are_checked(readers: dict[str, StoreReader]) -> None:
    a, b = readers["a"], readers["b"]
    with pytest.raises(ConfigError, match="at least one store"):
        MixedReader([], [])
    with pytest.raises(ConfigError, match="one name per store"):
        MixedReader([a, b], ["a"])
    for names in (["a", "a"], ["a", ""]):
        with pytest.raises(ConfigError, match="distinct non-empty names"):
            MixedReader([a, b], names)


def test_each_source_is_told_its_own_ids_in_order(readers: dict[str, StoreReader],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    mixed = mix(readers, "a", "b")
    told: dict[str, list[Any]] = {"a": [], "b": []}
    for name, reader in zip(mixed.names, mixed.sources, strict=True):
        monkeypatch.setattr(reader, "will_read", lambda ids, n=name: told[n].append(ids.tolist()))
    mixed.will_read(np.array([25, 3, 20, 7, 49, 0]))
    mixed.will_read(np.array([1, 2]))
    assert told["a"] == [[3, 7, 0], [1, 2]]
    assert told["b"] == [[5, 0, 29], []]


def test_remote_caches_sum_their_counts() -> None:
    def remote(hits: int, downloads: int) -> Any:
        counts = {"hits": hits, "downloads": downloads, "downloaded_bytes": 10 * downloads}
        return SimpleNamespace(cache=SimpleNamespace(counts=counts))

    caches = RemoteCaches([remote(1, 2), remote(3, 4)])
    assert caches.cache.counts == {"hits": 4, "downloads": 6, "downloaded_bytes": 60}


def test_a_batch_of_one_source_is_handed_its_rows(readers: dict[str, StoreReader]) -> None:
    """read_batch_into hands each source the batch's own rows: nothing but its ids' rows change."""
    mixed = mix(readers, "a", "b")
    out = np.zeros((4, 32, 32, 3), np.uint8)
    mixed.read_batch_into([21, 22, 23, 24], out[:4])
    for k, i in enumerate((1, 2, 3, 4)):
        np.testing.assert_array_equal(out[k], readers["b"].read(i))
    rows = np.zeros((3, 32, 32, 3), np.uint8)
    mixed.read_batch_into([0, 30], rows[:2])  # the batch's rows only: the row after stays as it was
    assert not rows[2].any()
    np.testing.assert_array_equal(rows[1], readers["b"].read(10))


def test_unsigned_ids_index_as_signed_ones(readers: dict[str, StoreReader]) -> None:
    mixed = mix(readers, "a", "b")
    ids = np.array([3, 25, 49], dtype=np.uint64)
    np.testing.assert_array_equal(mixed.labels[ids], mixed.labels[ids.astype(np.int64)])
    np.testing.assert_array_equal(mixed.source_of(ids)[1], [3, 5, 29])
    with pytest.raises(IndexError, match="out of range"):
        mixed.labels[np.array([2**63], dtype=np.uint64)]
