"""A shard's sha256, recorded in the store: a copy of a shard in a cache folder (several jobs on a
node may share one) or a download from a bucket is used only once it matches, so a file of the
right size with two chunks swapped, each crc32c intact, never serves one sample's pixels under
another's label. ``verify`` checks a bucket's own objects, and a local store's shards."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tilefeed.pipeline.reading.reader import StoreReader
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tilefeed.store import format as fmt
from tilefeed.store.attrs import StoreAttrs, attrs_digest
from tilefeed.store.documents import load_attrs
from tilefeed.store.shard import ShardIndex, sha256_fd
from tilefeed.store.errors import CorruptChunkError, StoreFormatError, UncheckedCacheWarning
from tilefeed.store.inspection import verify
from tilefeed.store.remote import RemoteStore
from tilefeed.store.object_storage import ObjectStorage
from tests.helpers import run_cli, s3_environment, write_folder

PER_SHARD = 8
SHARD = 0  # the shard the tests tamper with: samples 0..7, of two classes (6 per class)
SWAP = (0, 7)  # its first and last chunk: a c0 tile and a c1 tile


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server's endpoint, with this process's environment pointing at it."""
    with s3_environment(tmp_path_factory.mktemp("cache")) as env:
        yield env["AWS_ENDPOINT_URL"]


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A local store of 18 tiles in 3 shards, with every tile's pixels and label."""
    root = tmp_path_factory.mktemp("honest")
    src = write_folder(root / "src", classes=3, per_class=6)
    store = root / "store"
    preprocess(src, store, TileSettings(tile=32), StoreSettings(shard_size=PER_SHARD), workers=1)
    with StoreReader(store) as reader:
        pixels = np.stack([reader.read(i) for i in range(len(reader))])
        labels = reader.labels.copy()
    assert labels[SWAP[0]] != labels[SWAP[1]]  # the swap puts a c1 picture under a c0 label
    return {"store": store, "pixels": pixels, "labels": labels}


def swapped(shard: bytes) -> bytes:
    """The shard with two chunks swapped and the index rewritten: the same size, the index's and
    every chunk's crc32c valid, two samples' pictures each in the other's place."""
    tail = fmt.index_nbytes(PER_SHARD)
    index = ShardIndex.decode(shard[-tail:], PER_SHARD, "shard")
    chunks = [shard[int(o) : int(o) + int(n)] for o, n in index.table[: index.written()]]
    i, j = SWAP
    chunks[i], chunks[j] = chunks[j], chunks[i]
    data = b"".join(chunks) + ShardIndex.packed(PER_SHARD, [len(c) for c in chunks]).encode()
    assert len(data) == len(shard) and data != shard
    return data


def upload(local: Path, url: str) -> None:
    ObjectStorage(url).upload_tree(local, last="zarr.json")


def assert_honest(reader: StoreReader, honest: dict[str, Any]) -> None:
    np.testing.assert_array_equal(reader.labels, honest["labels"])
    for i in range(len(reader)):
        np.testing.assert_array_equal(reader.read(i), honest["pixels"][i], err_msg=f"sample {i}")


def replace_file(path: Path, data: bytes) -> None:
    """What another job on the node could leave: a new file of that name (a new inode)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def test_a_shared_cache_holding_a_swapped_shard_is_never_served(
        s3: str, honest: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url, cache = "s3://tilefeed/digests/shared", tmp_path / "cache"
    upload(honest["store"], url)
    good = fmt.shard_path(honest["store"], SHARD).read_bytes()
    bad = swapped(good)
    remote = RemoteStore(url, cache_dir=cache)  # where the store's mirror lies in the cache folder
    mirror = remote.mirror
    remote.close()
    cached = fmt.shard_path(mirror, SHARD)
    replace_file(cached, bad)  # found in the shared cache before this process ever read the store
    with StoreReader(url, cache_dir=cache) as reader:
        assert_honest(reader, honest)
    assert cached.read_bytes() == good  # downloaded again: the cache holds what the bucket holds

    # checked once per process and file: a second reader hashes no shard again
    hashed: list[int] = []
    real = sha256_fd

    def counted(fd: int) -> str:
        hashed.append(fd)
        return real(fd)

    monkeypatch.setattr("tilefeed.store.shard_cache.sha256_fd", counted)
    with StoreReader(url, cache_dir=cache) as reader:
        assert_honest(reader, honest)
    assert hashed == []
    # another job puts the swapped shard back after this process checked the cache
    replace_file(cached, bad)
    with StoreReader(url, cache_dir=cache) as reader:
        assert_honest(reader, honest)
    assert len(hashed) == 1 and cached.read_bytes() == good


def test_a_swapped_shard_in_the_bucket_is_refused_and_verify_names_it(
        s3: str, honest: dict[str, Any], tmp_path: Path) -> None:
    url, key = "s3://tilefeed/digests/swapped", fmt.shard_relpath(SHARD)
    upload(honest["store"], url)
    with StoreReader(url) as reader:  # the default cache (TILEFEED_CACHE) now holds honest copies
        assert_honest(reader, honest)
    bucket = ObjectStorage(url)
    bucket.write(key, swapped(bucket.read(key)))
    # the cached copy is honest and still serves; verify checks the bucket's object, not it
    done = run_cli("verify", url)
    assert done.returncode == 1, done.stdout + done.stderr
    found = [line for line in (done.stdout + done.stderr).splitlines() if key in line]
    assert found and "sha256" in found[0], done.stdout + done.stderr
    assert not list(Path(os.environ["TILEFEED_CACHE"]).glob(".verify-*"))  # its scratch folder went
    # a new cache downloads the bucket's object: refused, never placed in the cache
    cache = tmp_path / "cache"
    with StoreReader(url, cache_dir=cache) as reader:
        with pytest.raises(CorruptChunkError) as refused:
            reader.read(SWAP[0])
        np.testing.assert_array_equal(reader.read(PER_SHARD), honest["pixels"][PER_SHARD])  # others serve
    message = str(refused.value)
    assert "\n" not in message and f"{url}/{key}" in message and "sha256" in message, message
    assert not fmt.shard_path(reader.root, SHARD).exists()


def without_digests(store: Path) -> None:
    """The store as a tilefeed before shard digests wrote it: no shard_sha256, the attributes'
    digest recomputed."""
    doc = json.loads((store / "zarr.json").read_bytes())
    attrs = doc["attributes"][fmt.ATTRS_KEY]
    del attrs["arrays"][fmt.IMAGES]["shard_sha256"]
    attrs["digest"] = attrs_digest(attrs)
    (store / "zarr.json").write_text(json.dumps(doc))


def test_a_store_without_shard_digests_reads_from_a_bucket_with_one_warning(
        s3: str, honest: dict[str, Any], tmp_path: Path) -> None:
    old = tmp_path / "old"
    shutil.copytree(honest["store"], old)
    without_digests(old)
    assert StoreAttrs.from_dict(load_attrs(old), "old").shard_sha256 is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a local store has no cache: nothing to warn about
        with StoreReader(old) as reader:
            assert_honest(reader, honest)
        assert verify(old) == []
    url = "s3://tilefeed/digests/old"
    upload(old, url)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            with StoreReader(url, cache_dir=tmp_path / "cache") as reader:
                assert_honest(reader, honest)
    shown = [w for w in caught if issubclass(w.category, UncheckedCacheWarning)]
    assert len(shown) == 1 and len(caught) == 1, [str(w.message) for w in caught]
    assert url in str(shown[0].message) and "cannot be checked" in str(shown[0].message)


def test_local_verify_finds_a_shard_with_two_chunks_swapped(honest: dict[str, Any], tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(honest["store"], store)
    assert verify(store) == []
    path = fmt.shard_path(store, SHARD)
    path.write_bytes(swapped(path.read_bytes()))
    for deep in (False, True):
        problems = verify(store, deep=deep)
        assert problems == [f"{path}: differs from what was written (shard sha256 mismatch)"], problems


def test_the_shard_digests_are_checked_as_attributes(honest: dict[str, Any], tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(honest["store"], store)
    attrs = load_attrs(store)
    digests = attrs["arrays"][fmt.IMAGES]["shard_sha256"]
    assert digests == [hashlib.sha256(fmt.shard_path(store, s).read_bytes()).hexdigest()
                       for s in range(attrs["shards"])]
    for bad in (digests[:-1], [*digests[:-1], "ab" * 31], [*digests[:-1], digests[0].upper()], "x"):
        broken = dict(attrs, arrays={**attrs["arrays"], fmt.IMAGES: {
            **attrs["arrays"][fmt.IMAGES], "shard_sha256": bad}})
        with pytest.raises(StoreFormatError, match="arrays.images.shard_sha256"):
            StoreAttrs.from_dict(broken, "store")


def test_a_stores_image_and_mask_caches_keep_each_others_pinned_shards(tmp_path: Path) -> None:
    """Two caches of one store share its folder and limit (its images and its masks): making
    room for an image shard evicts the unpinned shards, never one the mask cache holds pinned,
    even when that one is the least recently used; the control, without peers, evicts it."""
    from tilefeed.store.shard_cache import ShardCache

    def caches(folder: Path) -> tuple[ShardCache, ShardCache]:
        mirror = folder / "store"
        images = ShardCache(None, mirror, folder, [100] * 4, 4, 300)  # type: ignore[arg-type]
        masks = ShardCache(None, mirror, folder, [100] * 4, 4, 300, array=fmt.MASKS)  # type: ignore[arg-type]
        for age, (cache, shard) in enumerate([(masks, 0), (images, 0), (images, 1)]):
            path = cache.path(shard)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(bytes(100))
            os.utime(path, (1000 + age, 1000 + age))  # the mask shard used longest ago
        masks.pinned.add(0)
        return images, masks

    images, masks = caches(tmp_path / "peers")
    images.peers, masks.peers = (masks,), (images,)
    assert images._make_room(2, 100, placing=False)
    assert masks.path(0).exists() and not images.path(0).exists() and images.path(1).exists()
    images, masks = caches(tmp_path / "alone")
    assert images._make_room(2, 100, placing=False)
    assert not masks.path(0).exists(), "without peers the mask shard, least recently used, goes first"
