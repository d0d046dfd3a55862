"""A store with boxes and instance masks written to object storage (a real S3 server) and read
from there: the Loader hands over what the store's folder copy hands over, batch for batch, its
masks' shards checked as its images' are; a damaged mask shard in the bucket is named."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tilefeed.pipeline import Loader
from tilefeed.preprocess import TileSettings, preprocess
from tilefeed.preprocess.settings import StoreSettings, TargetOptions
from tilefeed.store import format as fmt
from tilefeed.store.errors import CorruptChunkError
from tilefeed.store.inspection import info, verify
from tilefeed.store.object_storage import ObjectStorage
from tests.helpers import run_cli, s3_environment, tree_bytes
from tests.preprocess.targets_data import write_coco

T = 64  # tile side
URL = "s3://tilefeed/targets/coco"
OPTS: dict[str, Any] = dict(with_index=True, num_workers=1, train=True, seed=7, size=48, shuffle=True)
MASKS_KEY = fmt.shard_relpath(1, fmt.MASKS)  # the damaged shard of the tests below


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """One COCO set with instance masks preprocessed twice, into a folder and into a bucket
    (three shards of four tiles), while the S3 server runs."""
    tmp = tmp_path_factory.mktemp("bucket-targets")
    coco = write_coco(tmp / "set", images=8, planted=False)
    settings = dict(tiles=TileSettings(tile=T), store=StoreSettings(shard_size=4), workers=1,
                    targets=TargetOptions(annotations=str(coco.annotations), instance_masks=True))
    local = tmp / "local"
    preprocess(coco.src, local, **settings)
    with s3_environment(tmp / "cache") as env:
        summary = preprocess(coco.src, URL, **settings)
        assert summary.shards == 3 and summary.objects > 0
        # the bucket holds what the folder holds, object for file, byte for byte (the masks'
        # shards and the targets' arrays included); the same command again changes nothing
        storage = ObjectStorage(URL)
        files = tree_bytes(local)
        assert sorted(storage.sizes("")) == sorted(files)
        assert any(key.startswith(f"{fmt.MASKS}/c/") for key in files)
        assert all(storage.read(key) == data for key, data in files.items())
        assert preprocess(coco.src, URL, **settings).up_to_date
        yield local, env


def batches(loader: Loader) -> list[tuple[torch.Tensor, list[dict[str, torch.Tensor]], torch.Tensor]]:
    return [(images, list(targets), idx) for images, targets, idx in loader]


def same_batches(a: list[Any], b: list[Any]) -> bool:
    """Batch for batch: the same samples in the same order, equal pixels, equal boxes, labels
    and masks."""
    return len(a) == len(b) and all(
        torch.equal(ia, ib) and torch.equal(xa, xb) and len(ta) == len(tb)
        and all(u.keys() == v.keys() and all(torch.equal(u[k], v[k]) for k in u)
                for u, v in zip(ta, tb, strict=True))
        for (ia, ta, xa), (ib, tb, xb) in zip(a, b, strict=True))


def test_a_bucket_store_with_masks_hands_over_what_its_folder_does(stores: tuple[Path, dict[str, str]],
                                                                   tmp_path: Path) -> None:
    """Boxes and masks from the bucket equal the folder's, batch for batch, over two epochs:
    through the shard cache (mask shards downloaded once each) and by ranged requests (a cache
    limit smaller than the store, random order). A Loader asking for boxes fetches no mask."""
    local, _ = stores
    asked = dict(targets=("boxes", "masks"), **OPTS)
    want = []
    with Loader(local, 4, **asked) as here:
        for epoch in (0, 1):
            here.set_epoch(epoch)
            want.append(batches(here))
    assert any(int(t["masks"].max()) > 0 for batch in want[0] for t in batch[1])  # masks to compare
    with Loader(URL, 4, cache_dir=tmp_path / "whole", **asked) as there:
        got = []
        for epoch in (0, 1):
            there.set_epoch(epoch)
            got.append(batches(there))
        remote = there.reader.remote
        assert remote is not None and remote.mask_cache is not None
        assert remote.mask_cache.counts["downloads"] == 3  # each mask shard once, checked
    assert all(same_batches(w, g) for w, g in zip(want, got, strict=True))
    with Loader(URL, 4, cache_dir=tmp_path / "ranged", cache_limit=1 << 10, **asked) as there:
        assert there.reader.ranged
        got = []
        for epoch in (0, 1):
            there.set_epoch(epoch)
            got.append(batches(there))
    assert all(same_batches(w, g) for w, g in zip(want, got, strict=True))
    with Loader(URL, 4, cache_dir=tmp_path / "boxes", targets="boxes", **OPTS) as there:
        list(there)
        remote = there.reader.remote
        assert remote is not None and remote.mask_cache is not None
        assert remote.mask_cache.counts["downloads"] == 0
        assert not (tmp_path / "boxes" / remote.mirror.name / fmt.MASKS / "c").exists()


def _damage(key: str, at: int) -> bytes:
    """Flip one byte of object ``key`` of the store in the bucket (its size kept); the object's
    bytes before the damage."""
    storage = ObjectStorage(URL)
    good = storage.read(key)
    bad = bytearray(good)
    bad[at] ^= 0xFF
    with storage.writer(key) as f:
        f.write(bytes(bad))
    return good


def _restore(key: str, good: bytes) -> None:
    with ObjectStorage(URL).writer(key) as f:
        f.write(good)


def test_a_damaged_mask_shard_in_the_bucket_is_named(stores: tuple[Path, dict[str, str]],
                                                     tmp_path: Path) -> None:
    """A mask shard whose bytes changed in the bucket (its size kept) is refused naming its URL,
    never read as zeros: through the cache (sha256) and by ranged requests (the chunk's crc32c);
    ``verify`` names it, ``info`` shows the masks. The sound store passes the same checks."""
    _, env = stores
    asked = dict(targets=("boxes", "masks"), **OPTS)
    assert verify(URL, deep=True) == []  # the control: nothing to name before the damage
    good = _damage(MASKS_KEY, 20)  # inside the shard's first chunk
    try:
        for where, limit in (("cache", None), ("ranged", 1 << 10)):
            with Loader(URL, 4, cache_dir=tmp_path / where, cache_limit=limit, **asked) as there:
                with pytest.raises(CorruptChunkError) as refused:
                    list(there)
            message = str(refused.value)
            assert f"{URL}/{MASKS_KEY}" in message and "\n" not in message, message
            assert ("sha256 mismatch" if limit is None else "crc32c mismatch") in message, message
        # the same store asked for boxes only reads no mask: the damage is not met
        with Loader(URL, 4, cache_dir=tmp_path / "boxes", targets="boxes", **OPTS) as there:
            assert len(list(there)) == 3
        problems = verify(URL, deep=True)
        assert problems and all(f"{URL}/{MASKS_KEY}" in p for p in problems), problems
        shown = run_cli("verify", URL, env=env)
        assert shown.returncode != 0 and f"{URL}/{MASKS_KEY}" in shown.stdout + shown.stderr
    finally:
        _restore(MASKS_KEY, good)
    shown = run_cli("verify", "--deep", URL, env=env)
    assert shown.returncode == 0, shown.stderr
    assert info(URL).targets["masks"] == "instance"  # type: ignore[index]
    shown = run_cli("info", URL, env=env)
    assert shown.returncode == 0 and "instance masks" in shown.stdout, shown.stdout
