"""Stores in object storage: a real S3 server (moto's, on 127.0.0.1) through the real client.

Preprocess into a bucket, read it back tile for tile against a local store, resume after
kill -9, train under a cache limit, share a cache between processes, survive server faults,
and write from a Dask cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tilefeed.bench.fixtures.netem import CREDENTIALS, Proxy, local_s3, s3_options
from tilefeed.pipeline.loader.loader import Loader
from tilefeed.pipeline.mixing.mix import Mixture
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tilefeed.store import format as fmt
from tilefeed.store.errors import StoreAccessError, StoreFormatError
from tilefeed.store.cache_dir import exclusive_lock
from tilefeed.store.object_storage import ObjectStorage
from tests.helpers import run_cli, s3_environment, tree_bytes, write_folder

TILES, STORE = TileSettings(tile=32), StoreSettings(shard_size=8)
SECRET = CREDENTIALS["AWS_SECRET_ACCESS_KEY"]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server's endpoint, with this process's environment pointing at it."""
    with s3_environment(tmp_path_factory.mktemp("cache")) as env:
        yield env["AWS_ENDPOINT_URL"]


@pytest.fixture(scope="module")
def stores(s3: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    """(SRC, the bucket store made by the CLI, the same store made locally)."""
    root = tmp_path_factory.mktemp("bucket")
    src = write_folder(root / "src", classes=3, per_class=14)
    (src / "c1" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really")
    url = "s3://tilefeed/stores/train"
    args = ["--tile", "32", "--shard-size", "8", "--processes", "2", "--quiet"]
    done = run_cli("preprocess", str(src), url, *args)
    assert done.returncode == 0, done.stderr
    local = root / "local"
    assert run_cli("preprocess", str(src), str(local), *args).returncode == 0
    return src, url, local


def bucket_tree(url: str) -> dict[str, bytes]:
    storage = ObjectStorage(url)
    return {key: storage.read(key) for key in sorted(storage.sizes())}


def batches(loader: Loader) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    return [(x.numpy().copy(), y.numpy().copy(), i.numpy().copy()) for x, y, i in loader]


def same_epochs(a: Loader, b: Loader, epochs: int = 2) -> None:
    for _ in range(epochs):
        got, want = batches(a), batches(b)
        assert len(got) == len(want)
        for (x, y, i), (x2, y2, i2) in zip(got, want, strict=True):
            np.testing.assert_array_equal(i, i2)
            np.testing.assert_array_equal(y, y2)
            np.testing.assert_array_equal(x, x2)
        seen = np.concatenate([i for _, _, i in got])
        assert sorted(seen.tolist()) == list(range(len(a.reader)))  # each sample once


def loader(store: str | Path, **kw: Any) -> Loader:
    kw.setdefault("dtype", torch.uint8)
    return Loader(store, 5, with_index=True, workers=2, **kw)


def test_the_bucket_store_is_the_local_store_object_for_object(stores: tuple[Path, str, Path]) -> None:
    _, url, local = stores
    assert bucket_tree(url) == tree_bytes(local)  # metadata last, nothing of the work left


@pytest.mark.parametrize("shuffle", ["global", "shard"])
def test_a_loader_on_the_bucket_yields_what_the_local_store_yields(
        stores: tuple[Path, str, Path], tmp_path: Path, shuffle: str) -> None:
    _, url, local = stores
    same_epochs(loader(url, shuffle=shuffle, train=True, dtype=torch.float32, cache_dir=tmp_path),
                loader(local, shuffle=shuffle, train=True, dtype=torch.float32))


def test_info_and_verify_take_the_url_and_never_show_credentials(stores: tuple[Path, str, Path]) -> None:
    _, url, _ = stores
    shown = run_cli("info", url)
    assert shown.returncode == 0, shown.stderr
    assert "samples    42 tiles from 42 of 43 sources (1 rejected)" in shown.stdout
    checked = run_cli("verify", url, "--deep")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for out in (shown, checked):
        assert SECRET not in out.stdout + out.stderr
        assert CREDENTIALS["AWS_ACCESS_KEY_ID"] not in out.stdout + out.stderr


def test_a_missing_bucket_or_store_is_a_one_line_error(s3: str) -> None:
    for url, expected in [("s3://no-such-bucket/x", "NoSuchBucket"),
                          ("s3://tilefeed/nothing-here", "not a tilefeed store")]:
        done = run_cli("info", url)
        assert done.returncode == 1
        assert done.stderr.count("\n") == 1 and expected in done.stderr, done.stderr
        assert SECRET not in done.stderr
    with pytest.raises((StoreAccessError, StoreFormatError)):
        Loader("s3://no-such-bucket/x", 4)


def test_refused_credentials_are_a_one_line_error_before_training(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "1")  # moto checks keys once the bucket exists
    with local_s3() as endpoint:
        done = run_cli("info", "s3://tilefeed/x", env={**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint})
        assert done.returncode == 1
        assert done.stderr.count("\n") == 1 and "InvalidAccessKeyId" in done.stderr, done.stderr
        assert SECRET not in done.stderr and CREDENTIALS["AWS_ACCESS_KEY_ID"] not in done.stderr
        with pytest.raises(StoreAccessError, match="InvalidAccessKeyId"):
            Loader("s3://tilefeed/x", 4, storage_options=s3_options(endpoint))


def test_zarr_python_reads_the_bucket_store_directly(stores: tuple[Path, str, Path]) -> None:
    import zarr
    from zarr.storage import ObjectStore

    _, url, local = stores
    group = zarr.open_group(ObjectStore(ObjectStorage(url).store, read_only=True), mode="r")
    np.testing.assert_array_equal(group[fmt.IMAGES][11], zarr.open_array(str(local / fmt.IMAGES))[11])
    np.testing.assert_array_equal(group[fmt.LABELS][:], zarr.open_array(str(local / fmt.LABELS))[:])


def cache_bytes(cache: Path) -> int:
    """The shards' bytes in a cache folder, counted under its lock: a download makes room and
    takes it under that lock, so the count never sees a shard about to go beside one just come
    (a folder walk is no snapshot)."""
    with exclusive_lock(cache / ".lock"):
        return sum(p.stat().st_size for p in cache.glob(f"*/{fmt.IMAGES}/c/*/0/0/0"))


def test_a_cache_far_smaller_than_the_store_is_never_exceeded(
        stores: tuple[Path, str, Path], tmp_path: Path) -> None:
    _, url, local = stores
    largest = max(ObjectStorage(url).sizes(f"{fmt.IMAGES}/c").values())
    limit = 3 * largest  # the store holds 6 shards
    a = loader(url, shuffle="shard", shuffle_window=1, cache_dir=tmp_path, cache_limit=limit)
    b = loader(local, shuffle="shard", shuffle_window=1)
    peak = 0
    for _ in range(2):
        for (x, _, i), (x2, _, i2) in zip(a, b, strict=True):
            peak = max(peak, cache_bytes(tmp_path))
            assert torch.equal(i, i2) and torch.equal(x, x2)
    assert 0 < peak <= limit
    # random order and a cache below the store's size: ranged reads, nothing cached
    ranged = loader(url, shuffle="global", cache_dir=tmp_path / "r", cache_limit=limit)
    assert ranged.reader.ranged
    same_epochs(ranged, loader(local, shuffle="global"))
    assert cache_bytes(tmp_path / "r") == 0
    with pytest.raises(ValueError, match="raise it to at least"):
        loader(url, shuffle="shard", shuffle_window=4, cache_dir=tmp_path, cache_limit=limit)


def shard_files_bytes(cache: Path) -> int:
    """The bytes of the shard files in a cache folder, found by walking all of it (lock files,
    metadata, small arrays and unfinished downloads are no shards), under the folder's lock as
    ``cache_bytes`` counts."""
    total = 0
    with exclusive_lock(cache / ".lock"):
        for folder, _, names in os.walk(cache):
            for name in names:
                parts = Path(folder, name).relative_to(cache).parts
                number = parts[3] if len(parts) == 7 else ""
                if number.isdigit() and "/".join(parts[1:]) == fmt.shard_relpath(int(number)):
                    total += os.lstat(Path(folder, name)).st_size
    return total


@pytest.mark.parametrize("shards", [3, 2])
@pytest.mark.parametrize("shuffle", [False, "shard"])
def test_the_cache_limit_holds_after_every_batch_and_every_sample_comes_once(
        stores: tuple[Path, str, Path], tmp_path: Path, shuffle: bool | str, shards: int) -> None:
    """A limit of two or three shards (the store holds six) is kept with less read-ahead, not
    refused, and not overrun by the shards being read: in order and shard by shard, over epochs
    (the next epoch's plan comes while the last one's shards are still read)."""
    _, url, _ = stores
    largest = max(ObjectStorage(url).sizes(f"{fmt.IMAGES}/c").values())
    limit = shards * largest
    bucket = loader(url, shuffle=shuffle, shuffle_window=1, cache_dir=tmp_path, cache_limit=limit)
    peak = 0
    with bucket:
        for _ in range(3):
            seen: list[int] = []
            for _, _, i in bucket:
                held = shard_files_bytes(tmp_path)
                assert held <= limit, f"{held} bytes of shards in the cache, the limit is {limit}"
                peak = max(peak, held)
                seen += i.tolist()
            assert sorted(seen) == list(range(len(bucket.reader)))  # each sample once an epoch
    assert peak > 0  # the shards came through the cache folder


SHARED_READ = """
import sys, torch
from tilefeed import Loader
loader = Loader(sys.argv[1], 5, shuffle="shard", seed=int(sys.argv[3]), cache_dir=sys.argv[2],
                dtype=torch.uint8, workers=2, storage_options={"endpoint": sys.argv[4]})
print(sum(len(y) for _, y in loader))
"""


def test_two_processes_share_one_cache_and_download_each_shard_once(
        stores: tuple[Path, str, Path], s3: str, tmp_path: Path) -> None:
    _, url, _ = stores
    with Proxy(s3) as proxy:
        procs = [subprocess.Popen([sys.executable, "-c", SHARED_READ, url, str(tmp_path), str(seed),
                                   proxy.endpoint], stdout=subprocess.PIPE, text=True)
                 for seed in (1, 2)]
        outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert [o.split()[-1] for o in outs] == ["42", "42"]
    shards = proxy.stats.whole_gets("/0/0/0")
    assert len(shards) == 6 and set(shards.values()) == {1}, shards


def test_a_download_cut_off_by_a_kill_is_fetched_again_and_its_remains_removed(
        stores: tuple[Path, str, Path], tmp_path: Path) -> None:
    _, url, local = stores
    first = loader(url, shuffle="shard", cache_dir=tmp_path)
    same_epochs(first, loader(local, shuffle="shard"), 1)
    assert first.reader.remote is not None
    shard = first.reader.remote.cache.path(0)
    whole = shard.read_bytes()
    shard.unlink()  # as if the process downloading it had been killed
    remains = shard.with_name(f".{shard.name}.tmp-99999999-1")
    remains.write_bytes(whole[:1000])
    same_epochs(loader(url, shuffle="shard", cache_dir=tmp_path), loader(local, shuffle="shard"), 1)
    assert shard.read_bytes() == whole
    assert not remains.exists()


@pytest.mark.parametrize("fault", ["500", "reset", "truncate", "stall"])
def test_server_faults_are_retried_and_nothing_wrong_is_yielded(
        stores: tuple[Path, str, Path], s3: str, tmp_path: Path, fault: str) -> None:
    _, url, local = stores
    every = 3 if fault != "stall" else 7
    with Proxy(s3, fault=lambda n: fault if n % every == 0 else None, stall=5) as proxy:
        options = {"endpoint": proxy.endpoint, "timeout": "1s", "max_retries": "3"}
        for shuffle, limit in (("shard", None), ("global", 1)):
            same_epochs(loader(url, shuffle=shuffle, cache_dir=tmp_path / shuffle, cache_limit=limit,
                               storage_options=options),
                        loader(local, shuffle=shuffle), epochs=1)
    assert proxy.stats.faults >= 3


def wait_for(predicate: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.slow
def test_kill_9_during_upload_then_the_same_command_resumes(
        s3: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    src = write_folder(tmp_path / "src", classes=4, per_class=70, size=(160, 120))
    url = "s3://tilefeed/stores/killed"
    args = ["--tile", "32", "--shard-size", "20", "--processes", "2", "--quiet"]
    reference = tmp_path / "reference"
    assert run_cli("preprocess", str(src), str(reference), *args, timeout=300).returncode == 0
    storage = ObjectStorage(url)
    proc = subprocess.Popen([sys.executable, "-m", "tilefeed", "preprocess", str(src), url, *args],
                            start_new_session=True, stderr=subprocess.PIPE)
    wait_for(lambda: any(k.startswith(f"{fmt.IMAGES}/c/") for k in storage.sizes()))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert "zarr.json" not in storage.sizes()  # not complete: readers refuse it
    with pytest.raises(StoreFormatError, match="incomplete"):
        Loader(url, 4)
    again = run_cli("preprocess", str(src), url, *args[:-1], timeout=300)
    assert again.returncode == 0, again.stderr
    assert "resumed" in again.stdout
    assert bucket_tree(url) == tree_bytes(reference)


@pytest.mark.slow
def test_a_dask_cluster_writes_the_bucket_without_a_shared_folder(
        stores: tuple[Path, str, Path], tmp_path: Path) -> None:
    from distributed import LocalCluster

    src, _, local = stores
    url = "s3://tilefeed/stores/dask"
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        preprocess(src, url, TILES, STORE, scheduler=c.scheduler_address)
    assert bucket_tree(url) == tree_bytes(local)


def test_tile_dataset_on_a_bucket_in_dataloader_workers(stores: tuple[Path, str, Path], tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from tilefeed.pipeline.reading.dataset import TileDataset

    _, url, local = stores
    want = [t for t, _ in DataLoader(TileDataset(local), batch_size=7)]
    ds = TileDataset(url, cache_dir=tmp_path)
    got = [t for t, _ in DataLoader(ds, batch_size=7, num_workers=2, multiprocessing_context="forkserver")]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    # obstore cannot run in a child forked after it ran here: where a forked worker must
    # download (an empty cache), a clear error, never a hang
    cold = TileDataset(url, cache_dir=tmp_path / "empty")
    with pytest.raises(Exception, match="forkserver"):
        list(DataLoader(cold, batch_size=7, num_workers=1, multiprocessing_context="fork", timeout=60))


def test_src_may_be_a_bucket_too(stores: tuple[Path, str, Path], tmp_path: Path) -> None:
    src, _, local = stores
    images = ObjectStorage("s3://tilefeed/sources/train")
    for path in sorted(src.rglob("*")):
        if path.is_file():
            images.write(path.relative_to(src).as_posix(), path.read_bytes())
    summary = preprocess("s3://tilefeed/sources/train", tmp_path / "from-bucket", TILES, STORE, workers=2)
    assert (summary.tiles, summary.rejected) == (42, 1)
    ours, theirs = tree_bytes(tmp_path / "from-bucket"), tree_bytes(local)
    assert ours.keys() == theirs.keys()
    for key in ours:  # the same tiles and labels; only the recorded source paths differ
        if not key.startswith((fmt.SOURCE_PATHS, "zarr.json")):
            assert ours[key] == theirs[key], key


def test_a_source_object_that_cannot_be_read_is_a_reject(s3: str) -> None:
    from tilefeed.preprocess.images import Rejected, load_tiles

    with pytest.raises(Rejected, match="missing"):
        load_tiles("s3://tilefeed/sources/gone/c0/x.jpg", TILES)
    with pytest.raises(Rejected, match="unreadable"):
        load_tiles("s3://no-such-bucket/c0/x.jpg", TILES)


def test_stats_name_the_download_when_the_bucket_is_slow(
        stores: tuple[Path, str, Path], s3: str, tmp_path: Path) -> None:
    _, url, _ = stores
    with Proxy(s3, latency=0.25) as proxy:  # every request waits: shards arrive late
        slow = Loader(url, 5, shuffle="shard", workers=2, train=True, size=24,
                      storage_options=s3_options(proxy.endpoint), cache_dir=tmp_path)
        with slow:
            for _batch in slow:
                pass
            stats = slow.stats()
    assert stats.bottleneck == "download", str(stats)
    # at least one request's wait, less the timers' own offsets (0.2499 s was seen for 0.25)
    assert stats.epoch.stage_seconds["download"] > 0.2 and stats.last.wait > 0.2
    assert stats.cache is not None and stats.cache["downloads"] == 6  # a cold cache: every shard
    assert stats.cache["downloaded_bytes"] > 0 and "downloaded" in str(stats)


def test_a_mixture_of_a_bucket_store_and_a_local_one(stores: tuple[Path, str, Path]) -> None:
    """The same images in a bucket and on disk, mixed 3:1 over an epoch of 60 positions: the
    shares are exact, and each delivered tile is the one its store holds for that sample."""
    from collections import Counter

    from tilefeed.pipeline.mixing.mix import Mix

    _, url, local = stores
    mix = Mix({"bucket": url, "disk": local}, weights={"bucket": 3, "disk": 1}, epoch_samples=60)
    framing = dict(dtype=torch.uint8, layout="NHWC", with_index=True, num_workers=2)
    with Loader(local, 64, shuffle=False, **framing) as alone:  # type: ignore[arg-type]
        expected = next(iter(alone))[0].numpy()  # sample i at row i: the evaluation framing
    with Loader(mix, 16, storage_options=s3_options(os.environ["AWS_ENDPOINT_URL"]),
                **framing) as loader:  # type: ignore[arg-type]
        assert loader.reader.remote is not None  # the bucket's cache, seen through the mixture
        got = [(x.numpy().copy(), i.numpy().copy()) for x, _, i in loader]
    names, samples = loader.source_of(np.concatenate([i for _, i in got]))
    assert Counter(names) == {"bucket": 45, "disk": 15}
    images = np.concatenate([x for x, _ in got])
    for image, sample in zip(images, samples.tolist(), strict=True):
        np.testing.assert_array_equal(image, expected[sample])  # one tile, either store


def _three_stores(stores: tuple[Path, str, Path], root: Path) -> dict[str, str]:
    """A bucket store of 42 samples sub-sampled (20 an epoch), a local one of 42 (25 an epoch)
    and a tiny local one of 3 samples asked for 30 (ten times its size)."""
    _, url, local = stores
    tiny = root / "tiny"
    if not tiny.exists():
        src = write_folder(root / "tiny-src", classes=3, per_class=1)
        args = ["--tile", "32", "--shard-size", "8", "--processes", "2", "--quiet"]
        assert run_cli("preprocess", str(src), str(tiny), *args).returncode == 0
    return {"bucket": url, "disk": str(local), "tiny": str(tiny)}


THREE_WEIGHTS = {"bucket": 20, "disk": 25, "tiny": 30}


def _three_loader(paths: dict[str, str], batch: int, rank: int, world: int, **kw: Any) -> Loader:
    from tilefeed.pipeline.mixing.mix import Mix

    mix = Mix(paths, weights=THREE_WEIGHTS, epoch_samples=75)
    return Loader(mix, batch, rank=rank, world_size=world, seed=7, dtype=torch.uint8, layout="NHWC",
                  with_index=True, num_workers=2, storage_options=s3_options(os.environ["AWS_ENDPOINT_URL"]),
                  **kw)


def _three_killed(paths_json: str, ledger: str, state_file: str) -> None:
    import json

    from tests.helpers import train_until_killed

    train_until_killed(_three_loader(json.loads(paths_json), 4, 0, 2, ledger=ledger), state_file)


@pytest.mark.slow
def test_three_stores_one_in_a_bucket_keep_every_promise(
        stores: tuple[Path, str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    """One store ten times smaller than its share, one larger, one in a bucket: 1-4 ranks,
    shuffled and in order, drop_last both ways, deliver each epoch's planned multiset exactly
    (within the padding and drop_last rules); the sub-sampled bucket store is seen whole before
    any repeat; a kill mid-epoch and a resume on three ranks at another batch size audit clean."""
    import json
    from collections import Counter

    from tests.helpers import killed_and_resumed

    root = tmp_path_factory.mktemp("three")
    paths = _three_stores(stores, root)
    for shuffle in (True, False):
        for drop_last in (False, True):
            for world in (1, 2, 3, 4):
                got: Counter[int] = Counter()
                for rank in range(world):
                    with _three_loader(paths, 8, rank, world, shuffle=shuffle, drop_last=drop_last) as loader:
                        loader.set_epoch(1)
                        got.update(i for batch in loader for i in batch[-1].tolist())
                assert isinstance(loader.sources, Mixture)
                sources, samples = loader.sources.plan.locate(1, np.arange(75))
                plan = Counter((np.asarray(loader.sources.reader.offsets)[sources] + samples).tolist())
                extra, missing = got - plan, plan - got
                assert (not extra and sum(missing.values()) < world * 8) if drop_last else (
                    not missing and sum(extra.values()) < world), (shuffle, drop_last, world)
    with _three_loader(paths, 25, 0, 1) as loader:
        assert isinstance(loader.sources, Mixture) and loader.sources.plan.sizes == (42, 42, 3)
        seen = []
        for _ in range(3):
            names, samples = loader.source_of(np.concatenate([batch[-1] for batch in loader]))
            assert Counter(names) == THREE_WEIGHTS
            tiny = Counter(s for n, s in zip(names, samples.tolist(), strict=True) if n == "tiny")
            assert tiny == {0: 10, 1: 10, 2: 10}
            seen.append([s for n, s in zip(names, samples.tolist(), strict=True) if n == "bucket"])
    assert len(set(seen[0]) | set(seen[1])) == 40 and set(seen[0] + seen[1] + seen[2]) == set(range(42))
    ledger, state_file = root / "ledger", root / "state.json"
    child = (f"from tests.store.test_object_storage import _three_killed; "
             f"_three_killed({json.dumps(json.dumps(paths))}, {str(ledger)!r}, {str(state_file)!r})")

    def loader_of(batch: int, rank: int, world: int) -> Loader:
        return _three_loader(paths, batch, rank, world, ledger=ledger)

    epoch = killed_and_resumed(loader_of, child, ledger, state_file)
    assert epoch.ok and epoch.complete and epoch.population == 75
    assert epoch.sources is not None and {n: c["planned"] for n, c in epoch.sources.items()} == THREE_WEIGHTS
    assert sum(c["never"] for c in epoch.sources.values()) == 0
