"""Image-text sources read from a bucket in place: WebDataset tar shards (img2dataset's layout,
its per-shard parquet of failed downloads beside them) and parquet files, on a real S3 server
(moto's, on 127.0.0.1) through the real client. Each store is checked by key against the same
files preprocessed from this machine's disk, and the tars are shown never to be fetched whole:
the scan walks their headers through ranged GETs and skips the image data."""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import s3_environment
from tests.preprocess.test_pair_sources import (by_key, jpeg, scan, store_captions, write_parquet_folder,
                                               write_shards)
from tilefeed.bench.fixtures.netem import Proxy
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tilefeed.preprocess.sources import objects, webdataset
from tilefeed.preprocess.sources.finding import check_source, decide
from tilefeed.preprocess.sources.scanning import PairOptions, SourceKind, SourceOptions
from tilefeed.store import format as fmt
from tilefeed.store.errors import SourceError
from tilefeed.store.object_storage import ObjectStorage

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

BUCKET = "s3://tilefeed"
TILES, STORE = TileSettings(tile=32), StoreSettings(shard_size=4)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server's endpoint, with this process's environment pointing at it."""
    with s3_environment(tmp_path_factory.mktemp("cache"), ("tilefeed", "elsewhere")) as env:
        yield env["AWS_ENDPOINT_URL"]


def upload(folder: Path, prefix: str) -> None:
    """Every file of ``folder`` to ``prefix/NAME`` in the bucket."""
    bucket = ObjectStorage(BUCKET)
    for path in sorted(folder.iterdir()):
        if path.is_file():
            bucket.write(f"{prefix}/{path.name}", path.read_bytes())


def rejects_of(out: Path) -> dict[str, str]:
    from tilefeed.store.documents import load_attrs

    return {r["path"]: r["reason"] for r in load_attrs(out)["rejects"]}


def tiles_of(out: Path) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_group(str(out), mode="r")[fmt.IMAGES][:])  # type: ignore[index]


def covered(ranges: list[tuple[int, int]], start: int, end: int) -> int:
    """How many bytes of [start, end) the ranges hold (counted once)."""
    held = np.zeros(end - start, dtype=bool)
    for a, b in ranges:
        held[max(a, start) - start : max(min(b, end) - start, 0)] = True
    return int(held.sum())


def test_webdataset_shards_in_a_bucket_read_in_place_as_the_local_ones(s3: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "shards"
    written, rejects = write_shards(root)
    upload(root, "wds")
    ObjectStorage(BUCKET).write("wds/00002.tar", b"not a tar at all\n" * 64)  # listed, yet no tar
    local = tmp_path / "local"
    done = preprocess(root, local, TILES, STORE, workers=1, pairs=PairOptions())
    assert (done.accepted, done.rejected) == (len(written), len(rejects))

    fetched: list[tuple[str, int, int]] = []  # every ranged GET of the scan, in this process
    read_range = objects.read_range

    def counted(obj: objects.BucketObject, start: int, end: int) -> bytes:
        fetched.append((obj.url, start, end))
        return read_range(obj, start, end)

    for module in (objects, webdataset):  # the scan's reads through RangedFile, and its own
        monkeypatch.setattr(module, "read_range", counted)
    monkeypatch.setattr(webdataset, "TAR_READ_AHEAD", 512)  # smaller than any image: each is skipped
    out = tmp_path / "bucket"
    with Proxy(s3) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        done = preprocess(f"{BUCKET}/wds/", out, TILES, STORE, workers=1, pairs=PairOptions())
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3)
    assert (done.accepted, done.rejected) == (len(written), len(rejects) + 1)
    store_captions(out, {k: v["caption"] for k, v in written.items()})
    np.testing.assert_array_equal(tiles_of(out), tiles_of(local))
    found = rejects_of(out)
    junk = found.pop(f"{BUCKET}/wds/00002.tar")
    assert junk.startswith("corrupt or truncated tar after 0 samples (those kept): ReadError"), junk
    assert found == {path.replace(str(root), f"{BUCKET}/wds"): reason for path, reason in rejects.items()}
    assert rejects_of(local) == rejects

    # no tar fetched whole, by the scan or by a worker; the scan read no image's bytes
    assert not proxy.stats.whole_gets(".tar"), proxy.stats.whole_gets(".tar")
    for s in range(2):
        url = f"{BUCKET}/wds/{s:05d}.tar"
        ranges = [(a, b) for u, a, b in fetched if u == url]
        size = (root / f"{s:05d}.tar").stat().st_size
        assert 0 < sum(b - a for a, b in ranges) < size, (ranges, size)
        with tarfile.open(root / f"{s:05d}.tar") as tar:
            images = [m for m in tar.getmembers() if m.name.endswith(".jpg")]
        # at most the last byte of an image whose size is a multiple of 512: tarfile reads the
        # byte before each header to tell a tar that ends early
        assert all(covered(ranges, m.offset_data, m.offset_data + m.size) <= 1 for m in images)

    # the same objects: the same fingerprint, whatever the read-ahead; a resumed run has nothing to do
    monkeypatch.setattr(webdataset, "TAR_READ_AHEAD", 1 << 20)
    again = preprocess(f"{BUCKET}/wds/{{00000..00002}}.tar", out, TILES, STORE, workers=1, pairs=PairOptions())
    assert again.up_to_date


def test_bucket_shards_by_pattern_list_and_tar_and_their_refusals(s3: str, tmp_path: Path) -> None:
    root = tmp_path / "shards"
    written, rejects = write_shards(root)
    upload(root, "lists/shards")
    bucket = ObjectStorage(BUCKET)
    bucket.write("lists/shards/all.txt", b"# the two shards\n00001.tar\n\n00000.tar\n")
    pairs = PairOptions()
    assert decide(f"{BUCKET}/lists/shards/", pairs) is SourceKind.WEBDATASET
    assert decide(f"{BUCKET}/lists/shards/{{00000..00001}}.tar", pairs) is SourceKind.WEBDATASET
    assert decide(f"{BUCKET}/lists/shards/00000.parquet", pairs) is SourceKind.PARQUET
    in_bucket = {path.replace(str(root), f"{BUCKET}/lists/shards"): why for path, why in rejects.items()}
    for src in (f"{BUCKET}/lists/shards/{{00000..00001}}.tar", f"{BUCKET}/lists/shards/all.txt"):
        listing = scan(src, tmp_path)
        found = by_key(listing)
        assert {k: v["t"]["caption"] for k, v in found.items()} == {k: v["caption"] for k, v in written.items()}
        assert {k: v["f"] for k, v in found.items()} == {k: v["fields"] for k, v in written.items()}
        assert dict(listing.skipped) == in_bucket
    member = found["000010002"]["m"]
    assert member["tar"] == f"{BUCKET}/lists/shards/00001.tar"
    assert member["tar_size"] == (root / "00001.tar").stat().st_size and member["etag"]
    assert webdataset.read_member(member) == jpeg(102)  # a worker's read: one ranged GET
    one = scan(f"{BUCKET}/lists/shards/00001.tar", tmp_path)
    assert set(by_key(one)) == {k for k in written if k.startswith("00001")}

    # a member whose tar was replaced since the scan is refused, never read from the new bytes
    bucket.write("lists/shards/00001.tar", (root / "00000.tar").read_bytes())
    with pytest.raises(objects.ObjectChanged, match="changed since the scan"):
        webdataset.read_member(member)
    bucket.write("lists/shards/00001.tar", (root / "00001.tar").read_bytes())

    # a missing shard is a reject; a pattern that matches nothing, a list that climbs out of its
    # prefix, a list naming another bucket, a caption table in a bucket: one-line refusals
    missing = scan(f"{BUCKET}/lists/shards/{{00000..00002}}.tar", tmp_path)
    assert dict(missing.skipped)[f"{BUCKET}/lists/shards/00002.tar"] == "missing: object not found"
    with pytest.raises(SourceError, match="the pattern matches no object"):
        scan(f"{BUCKET}/lists/shards/{{00007..00009}}.tar", tmp_path)
    bucket.write("lists/shards/up.txt", b"../00000.tar\n")
    with pytest.raises(SourceError, match=r"up.txt:1: path '../00000.tar' is outside the prefix"):
        scan(f"{BUCKET}/lists/shards/up.txt", tmp_path)
    bucket.write("lists/shards/other.txt", b"s3://elsewhere/00000.tar\n")
    with pytest.raises(SourceError, match="--allow-bucket s3://elsewhere"):
        scan(f"{BUCKET}/lists/shards/other.txt", tmp_path)
    allowed = scan(f"{BUCKET}/lists/shards/other.txt", tmp_path,
                   options=SourceOptions(buckets=("s3://elsewhere",)))
    assert dict(allowed.skipped) == {"s3://elsewhere/00000.tar": "missing: object not found"}
    with pytest.raises(SourceError, match="caption tables are read from this machine's files only"):
        check_source(f"{BUCKET}/captions.tsv", PairOptions(source=SourceKind.TABLE))
    with pytest.raises(SourceError, match="carries credentials") as refused:
        check_source("s3://user:hunter2@tilefeed/wds/", pairs)
    assert "hunter2" not in str(refused.value)
    with pytest.raises(SourceError, match="holds no .tar objects"):
        scan(f"{BUCKET}/nothing-here/", tmp_path, PairOptions(source=SourceKind.WEBDATASET))


def test_parquet_in_a_bucket_read_through_ranged_gets_as_the_local_file(s3: str, tmp_path: Path) -> None:
    folder = write_parquet_folder(tmp_path / "pq")
    schema = pq.read_schema(folder / "a.parquet")
    upload(folder, "data/pq")
    pairs = PairOptions(caption_key=("text",), fields=("width",))
    assert decide(f"{BUCKET}/data/pq/", pairs) is SourceKind.PARQUET

    listing = scan(f"{BUCKET}/data/pq/", tmp_path, pairs)
    assert "SRC read as parquet (2 files)" in listing.notes
    found = by_key(listing, key=lambda p: p.split("#")[-1] if "#" in p else os.path.basename(p))
    url = f"{BUCKET}/data/pq/a.parquet"
    assert dict(listing.skipped) == {f"{url}#3": "no caption: none of text is given"}
    size = (folder / "a.parquet").stat().st_size
    for row in (0, 1, 2, 4):
        held: dict[str, Any] = found[str(row)]["m"]
        assert found[str(row)]["t"] == {"text": f"row {row}"} and found[str(row)]["f"] == {"width": row}
        assert {k: held[k] for k in ("parquet", "group", "row", "column", "parquet_size")} == {
            "parquet": url, "group": row // 2, "row": row % 2, "column": "picture", "parquet_size": size}
    assert found["side.jpg"]["path"] == f"{BUCKET}/data/pq/side.jpg" and found["side.jpg"]["m"] is None
    from tilefeed.preprocess.sources.parquet import MemberReader

    reader = MemberReader()  # the worker's read of a row: its row group's image column, by ranges
    assert reader.read(found["4"]["m"]) == jpeg(4) and reader.read(found["1"]["m"]) == jpeg(1)

    out, local = tmp_path / "bucket", tmp_path / "local"
    for src, store in ((f"{BUCKET}/data/pq/", out), (folder, local)):
        preprocess(src, store, TILES, STORE, workers=1, pairs=pairs)
        store_captions(store, {"0": "row 0", "1": "row 1", "2": "row 2", "4": "row 4", "side": "beside"},
                       key=lambda p: p.split("#")[-1] if "#" in p else Path(p).stem, name="text")
    np.testing.assert_array_equal(tiles_of(out), tiles_of(local))
    assert rejects_of(out) == {f"{url}#3": "no caption: none of text is given"}
    assert preprocess(url.rsplit("/", 1)[0] + "/", out, TILES, STORE, workers=1, pairs=pairs).up_to_date

    # a row naming a picture outside the file's prefix, or in a bucket not allowed: refused
    outside = pa.table({"picture": [{"bytes": None, "path": "../x.jpg"}], "text": ["up"], "width": [1]},
                       schema=schema)
    pq.write_table(outside, tmp_path / "up.parquet")
    ObjectStorage(BUCKET).write("data/pq/up/up.parquet", (tmp_path / "up.parquet").read_bytes())
    with pytest.raises(SourceError, match=r"path '../x.jpg' is outside the prefix"):
        scan(f"{BUCKET}/data/pq/up/up.parquet", tmp_path, pairs)
    ObjectStorage(BUCKET).write("data/pq/bad/notes.parquet", b"PAR1 not really PAR1")
    with pytest.raises(SourceError, match="not a parquet file: its footer declares"):
        scan(f"{BUCKET}/data/pq/bad/notes.parquet", tmp_path, pairs)
