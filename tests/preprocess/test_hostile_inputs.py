"""Inputs crafted to hurt the writer and the shard cache: each is refused in one line (or, for an
image or a name, rejected with its reason while the rest of the run completes), within seconds,
in bounded memory, touching no file outside the store or the cache.

The bucket cases run against a real S3 server (moto's, on 127.0.0.1) through the real client;
every command runs as a user runs it, in a process of its own whose memory peak is measured.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tilefeed.bench.fixtures.netem import CREDENTIALS
from tilefeed.store import format as fmt
from tilefeed.store.documents import load_attrs
from tilefeed.store.errors import CacheError
from tilefeed.store.remote import RemoteStore
from tilefeed.preprocess.settings import default_workers
from tilefeed.store.object_storage import ObjectStorage
from tests.helpers import photo, run_cli, s3_environment, write_folder
from tests.preprocess.hostile_inputs_helpers import (Run, parquet_declaring_rows, run_measured, snapshot,
                                                     tar_member, write_grey_png, write_hostile_tar)

MIB = 1 << 20
BUDGET_MIB = 1024  # every process of every run here
PNG_WORKER_MIB = 2048  # the worker that decodes the 13000 x 13000 16-bit PNG
SECONDS = 30
ARGS = ["--tile", "32", "--shard-size", "8", "--processes", "1", "--quiet"]


def bounded(run: Run, worker_mib: float = BUDGET_MIB) -> Run:
    assert run.seconds < SECONDS, run.seconds
    assert run.driver_mib < BUDGET_MIB, run.driver_mib
    assert run.worker_mib < worker_mib, run.worker_mib
    return run


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The server's environment: endpoint and credentials (this process's too, while it runs)."""
    with s3_environment(tmp_path_factory.mktemp("default-cache"), ("tilefeed", "another-bucket")) as env:
        yield env


@pytest.fixture(scope="module")
def bucket_store(s3: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> str:
    src = write_folder(tmp_path_factory.mktemp("bucket") / "src", classes=2, per_class=12)
    url = "s3://tilefeed/stores/a"
    done = run_cli("preprocess", str(src), url, *ARGS, env=s3)
    assert done.returncode == 0, done.stderr
    return url


# -- the bucket mirror and the cache folder ---------------------------------------------------
def test_an_extra_object_under_a_bucket_store_is_neither_fetched_nor_cached(
        bucket_store: str, s3: dict[str, str], tmp_path: Path) -> None:
    storage = ObjectStorage(bucket_store)
    block = bytes(MIB)
    with storage.writer("notes/extra.bin") as f:  # 384 MiB the store does not declare
        for _ in range(384):
            f.write(block)
    cache = tmp_path / "cache"
    try:
        checked = bounded(run_measured("verify", bucket_store, "--quiet",
                                       env={**s3, "TILEFEED_CACHE": str(cache)}))
    finally:
        storage.delete(["notes/extra.bin"])
    assert checked.returncode == 0, checked.output
    cached = [p for p in cache.rglob("*") if p.is_file()]
    assert not [p for p in cached if "notes" in p.parts or p.stat().st_size > MIB], cached
    assert os.stat(cache).st_mode & 0o077 == 0  # the cache folder is the user's alone


def test_a_declared_object_larger_than_the_store_allows_is_refused_unread(
        s3: dict[str, str], tmp_path: Path) -> None:
    src = write_folder(tmp_path / "src", classes=2, per_class=3)
    url = "s3://tilefeed/stores/inflated"
    assert run_cli("preprocess", str(src), url, *ARGS, env=s3).returncode == 0
    with ObjectStorage(url).writer(f"{fmt.LABELS}/c/0") as f:  # six labels' chunk, now 2 MiB
        f.write(bytes(2 * MIB))
    cache = tmp_path / "cache"
    line = bounded(run_measured("info", url, env={**s3, "TILEFEED_CACHE": str(cache)})).refused(
        f"{url}/{fmt.LABELS}/c/0", "more than")
    assert f"{2 * MIB} bytes" in line
    assert not [p for p in cache.rglob("*") if p.is_file() and p.stat().st_size > MIB]


def test_a_link_in_the_cache_folder_never_leads_eviction_or_writes_elsewhere(
        bucket_store: str, tmp_path: Path) -> None:
    other = tmp_path / "other"  # another store's shards, older than any in the cache
    other_shards = other / fmt.IMAGES / "c"
    for shard in range(3):
        path = other_shards / str(shard) / "0" / "0" / "0"
        path.parent.mkdir(parents=True)
        path.write_bytes(os.urandom(4096))
        os.utime(path, (1, 1))
    (other / "zarr.json").write_text("{}")
    before = snapshot(other)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "planted").symlink_to(other, target_is_directory=True)
    largest = max(ObjectStorage(bucket_store).sizes(f"{fmt.IMAGES}/c").values())
    remote = RemoteStore(bucket_store, cache_dir=cache, cache_limit=2 * largest)
    try:
        for shard in range(remote.attrs["shards"]):  # every download makes room by evicting
            remote.cache.fetch(shard)
    finally:
        remote.close()
    assert snapshot(other) == before
    assert (cache / "planted").is_symlink()
    # the store's own folder in the cache planted as a link: refused, nothing written through it
    victim = tmp_path / "victim"
    victim.mkdir()
    digest = remote.attrs["digest"]
    key = hashlib.sha256(f"{remote.storage.url}\0{digest}".encode()).hexdigest()[:20]
    fresh = tmp_path / "fresh-cache"
    fresh.mkdir()
    (fresh / key).symlink_to(victim, target_is_directory=True)
    with pytest.raises(CacheError, match="symbolic link"):
        RemoteStore(bucket_store, cache_dir=fresh)
    assert list(victim.iterdir()) == []


def test_a_cache_folder_of_another_user_is_refused(bucket_store: str, tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 1, -1)
    with pytest.raises(CacheError, match="belongs to another user"):
        RemoteStore(bucket_store, cache_dir=theirs)
    assert list(theirs.iterdir()) == []


def test_a_lock_file_planted_as_a_link_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    src = write_folder(tmp_path / "src", classes=2, per_class=2)
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    before = snapshot(victim)
    (tmp_path / ".out.tilefeed-lock").symlink_to(victim)
    bounded(run_measured("preprocess", str(src), str(tmp_path / "out"), *ARGS)).refused(
        "lock file", "symbolic link")
    assert snapshot(victim) == before


def test_a_scan_folder_planted_as_a_link_is_removed_and_its_target_untouched(tmp_path: Path) -> None:
    src = write_folder(tmp_path / "src", classes=2, per_class=2)
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep me\n")
    before = snapshot(victim)
    planted = tmp_path / ".out.tilefeed-scan"  # where the writer lists SRC, beside OUT
    planted.symlink_to(victim)
    done = bounded(run_measured("preprocess", str(src), str(tmp_path / "out"), *ARGS))
    assert done.returncode == 0, done.output
    assert snapshot(victim) == before and not os.path.lexists(planted)


# -- big images ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def big_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two small photos, a 16-bit PNG of 13000 x 13000 (under the default --max-pixels) and an
    8-bit one of 13500 x 13400, over Pillow's own limit of 178,956,970 pixels."""
    src = write_folder(tmp_path_factory.mktemp("big") / "src", classes=2, per_class=1)
    write_grey_png(src / "c0" / "deep.png", 13000, 13000, 16)
    write_grey_png(src / "c1" / "wide.png", 13500, 13400, 8)
    return src


def test_big_images_decode_in_bounded_memory_and_max_pixels_is_the_one_limit(
        big_images: Path, tmp_path: Path) -> None:
    # --max-pixels above Pillow's own limit lets the 180,900,000-pixel picture in; the 16-bit
    # picture, converted in strips, keeps its worker under the bound
    out = tmp_path / "out"
    done = bounded(run_measured("preprocess", str(big_images), str(out), *ARGS, "--max-pixels", "200000000"),
                   worker_mib=PNG_WORKER_MIB)
    assert done.returncode == 0, done.output
    attrs = load_attrs(out)
    assert attrs["rejects"] == [] and attrs["accepted"] == 4
    # the default --max-pixels, and a budget the 16-bit picture does not fit: each a reject
    # naming its size, the rest stored
    small = tmp_path / "small"
    done = bounded(run_measured("preprocess", str(big_images), str(small), *ARGS, "--worker-memory", "256M"))
    assert done.returncode == 0, done.output
    attrs = load_attrs(small)
    rejects = {Path(r["path"]).name: r["reason"] for r in attrs["rejects"]}
    assert rejects["wide.png"].startswith("too large: 13500x13400 = 180900000 pixels exceeds --max-pixels")
    assert rejects["deep.png"].startswith("too large: 13000x13000 pixels (I;16) need about")
    assert rejects["deep.png"].endswith("over --worker-memory 256 MiB")
    assert attrs["accepted"] == 2


def test_the_default_worker_count_fits_the_memory_budget() -> None:
    assert default_workers(1 << 50) == 1  # no machine holds two such workers
    assert 1 <= default_workers(64 * MIB) <= len(os.sched_getaffinity(0))


# -- manifests ----------------------------------------------------------------------------------
@pytest.fixture
def listed(tmp_path: Path) -> tuple[Path, Path]:
    """(a manifest's folder holding one good image, a secret image outside it)."""
    folder = tmp_path / "lists"
    folder.mkdir()
    photo(1, 40, 30).save(folder / "good.jpg")
    (tmp_path / "x").mkdir()
    secret = tmp_path / "x" / "secret.jpg"
    photo(2, 40, 30).save(secret)
    return folder, secret


def refused_row(folder: Path, row: str, *expected: str, extra: tuple[str, ...] = (),
                env: dict[str, str] | None = None) -> None:
    (folder / "m.csv").write_text(f"good.jpg,0\n{row},1\n")
    out = folder.parent / "out"
    bounded(run_measured("preprocess", "m.csv", str(out), *ARGS, *extra, cwd=folder, env=env)).refused(
        "m.csv:2: ", *expected)
    assert not out.exists()


def test_a_manifest_row_with_another_scheme_is_refused_naming_the_line(listed: tuple[Path, Path]) -> None:
    folder, _ = listed
    (folder / "a:").mkdir()  # so that the text, read as a path from here, leads to the secret
    refused_row(folder, "a://../../x/secret.jpg", "a:// is not an object store")


def test_a_manifest_row_that_links_outside_its_folder_is_refused(listed: tuple[Path, Path]) -> None:
    folder, secret = listed
    (folder / "link.jpg").symlink_to(secret)
    refused_row(folder, "link.jpg", "outside the manifest's folder", "--allow-outside")


def test_a_manifest_row_in_a_bucket_is_read_only_when_allowed(
        listed: tuple[Path, Path], s3: dict[str, str]) -> None:
    folder, secret = listed
    with ObjectStorage("s3://another-bucket").writer("private.jpg") as f:
        f.write(secret.read_bytes())
    row = "s3://another-bucket/private.jpg"
    refused_row(folder, row, "--allow-bucket s3://another-bucket", env=s3)
    refused_row(folder, "s3://user:hunter22@another-bucket/private.jpg", "credentials", env=s3,
                extra=("--allow-bucket", "*"))
    (folder / "m.csv").write_text(f"good.jpg,0\n{row},1\n")
    done = bounded(run_measured("preprocess", "m.csv", str(folder.parent / "allowed"), *ARGS,
                                "--allow-bucket", "s3://another-bucket", cwd=folder, env=s3))
    assert done.returncode == 0, done.output
    assert load_attrs(folder.parent / "allowed")["accepted"] == 2


# -- targets: annotation and label files ----------------------------------------------------------
def test_an_annotations_file_over_the_limit_is_refused_unread(tmp_path: Path) -> None:
    """A 2 GiB COCO file (sparse here: it takes no disk) against the default 1 GiB limit: parsed,
    it would take several times that; it is refused in one line before a byte is read."""
    src = write_folder(tmp_path / "src", classes=1, per_class=2)
    huge = tmp_path / "instances.json"
    with open(huge, "wb") as f:
        f.truncate(2 << 30)
    run = bounded(run_measured("preprocess", str(src / "c0"), str(tmp_path / "out"), "--annotations",
                               str(huge), *ARGS))
    run.refused(str(huge), f"{2 << 30} bytes (2.0 GiB)", "over the 1.0 GiB limit", "--max-annotations-size")
    assert not (tmp_path / "out" / "zarr.json").exists()


def test_a_label_file_over_the_limit_rejects_its_image_and_the_run_completes(tmp_path: Path) -> None:
    """A YOLO label file of 1 GiB (sparse; its first line a valid box) rejects its image, unread,
    naming the file and its size; the other images are stored."""
    from tests.preprocess.targets_data import write_yolo

    yolo = write_yolo(tmp_path, images=4)
    label = yolo.src / "labels" / "001.txt"
    with open(label, "r+b") as f:
        f.truncate(1 << 30)
    out = tmp_path / "out"
    done = bounded(run_measured("preprocess", str(yolo.src), str(out), "--yolo", *ARGS))
    assert done.returncode == 0, done.output
    reasons = {os.path.basename(r["path"]): r["reason"] for r in load_attrs(out)["rejects"]}
    assert reasons["001.jpg"] == (f"labels too large: labels/001.txt is {1 << 30} bytes, over the 16 MiB a "
                                  "label file may hold")
    assert load_attrs(out)["accepted"] == 3


def test_a_pipe_in_place_of_an_annotations_or_label_file_never_blocks(tmp_path: Path) -> None:
    """A named pipe (nothing ever writes to it) given as the COCO file refuses the run in one
    line, and one in place of a YOLO label file rejects its image: the open does not wait."""
    from tests.preprocess.targets_data import write_yolo

    src = write_folder(tmp_path / "src", classes=1, per_class=2)
    pipe = tmp_path / "instances.json"
    os.mkfifo(pipe)
    run = bounded(run_measured("preprocess", str(src / "c0"), str(tmp_path / "out"), "--annotations",
                               str(pipe), *ARGS))
    run.refused(str(pipe), "not a regular file")
    yolo = write_yolo(tmp_path / "yolo", images=4)
    label = yolo.src / "labels" / "002.txt"
    label.unlink()
    os.mkfifo(label)
    out = tmp_path / "yolo-out"
    done = bounded(run_measured("preprocess", str(yolo.src), str(out), "--yolo", *ARGS))
    assert done.returncode == 0, done.output
    reasons = {os.path.basename(r["path"]): r["reason"] for r in load_attrs(out)["rejects"]}
    assert reasons["002.jpg"] == "unreadable labels: labels/002.txt: not a regular file"
    assert load_attrs(out)["accepted"] == 3


# -- names and secrets ----------------------------------------------------------------------------
def test_a_file_name_that_is_not_utf8_is_a_reject_and_the_run_completes(tmp_path: Path) -> None:
    src = write_folder(tmp_path / "src", classes=2, per_class=2)
    with open(os.path.join(os.fsencode(src / "c1"), b"caf\xe9.jpg"), "wb") as f:
        photo(5, 40, 30).save(f, format="JPEG")
    out = tmp_path / "out"
    done = bounded(run_measured("preprocess", str(src), str(out), *ARGS[:-1]))
    assert done.returncode == 0, done.output
    assert "unusable name" in done.stdout
    attrs = load_attrs(out)
    assert attrs["accepted"] == 4 and attrs["samples"] == 4
    [reject] = attrs["rejects"]
    assert reject["path"].endswith("c1/caf\\xe9.jpg") and "not valid UTF-8" in reject["reason"]
    shown = run_cli("info", str(out), "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["rejected"] == 1


def test_a_password_in_a_storage_option_never_shows(
        s3: dict[str, str], tmp_path: Path) -> None:
    src = write_folder(tmp_path / "src", classes=2, per_class=1)
    host = s3["AWS_ENDPOINT_URL"].split("//", 1)[1]
    option = ["--storage-option", f"endpoint=http://someone:PASSWORD-x1y2@{host}"]
    for args in (["preprocess", str(src), "s3://no-such-bucket/x", *ARGS, *option],
                 ["info", "s3://no-such-bucket/x", *option]):
        done = bounded(run_measured(*args, env=s3))
        done.refused("NoSuchBucket")
        assert "PASSWORD-x1y2" not in done.output
        assert CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in done.output


def test_the_storage_layer_keeps_a_password_out_of_its_errors_for_python_callers(
        s3: dict[str, str]) -> None:
    from tilefeed.store.errors import StoreAccessError
    from tilefeed.store.object_storage import ObjectStorage

    host = s3["AWS_ENDPOINT_URL"].split("//", 1)[1]
    storage = ObjectStorage("s3://no-such-bucket/x",
                            {"endpoint": f"http://someone:PASSWORD-x1y2@{host}"})
    with pytest.raises(StoreAccessError) as refused:
        storage.sizes("")
    text = str(refused.value)
    assert "NoSuchBucket" in text and "PASSWORD-x1y2" not in text and len(text.splitlines()) == 1


def test_an_unusable_image_in_a_bucket_keeps_credentials_out_of_the_rejects(
        s3: dict[str, str], tmp_path: Path) -> None:
    folder = tmp_path / "lists"
    folder.mkdir()
    photo(1, 40, 30).save(folder / "good.jpg")
    (folder / "m.csv").write_text("good.jpg,0\ns3://no-such-bucket/absent.jpg,1\n")
    out = tmp_path / "out"
    env = {**s3, "AWS_ENDPOINT_URL": s3["AWS_ENDPOINT_URL"].replace("//", "//someone:PASSWORD-x1y2@")}
    done = bounded(run_measured("preprocess", "m.csv", str(out), *ARGS[:-1], "--allow-bucket", "*",
                                cwd=folder, env=env))
    assert done.returncode == 0, done.output
    stored = (out / "zarr.json").read_text()
    assert "absent.jpg" in stored
    for text in (stored, done.output):
        assert "PASSWORD-x1y2" not in text and CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in text


# -- image-text sources: tar shards and parquet files ---------------------------------------------
def test_hostile_tar_members_are_rejects_and_nothing_outside_the_store_is_written(tmp_path: Path) -> None:
    """Members that climb out, are absolute, links, a fifo; captions that are not UTF-8, hold a
    NUL or are 100 MB; metadata nested 500,000 deep or of 2 MiB; a tar cut inside a member:
    each a reject with its reason, read in bounded memory and never followed or extracted."""
    image = io.BytesIO()
    photo(3, 40, 30).save(image, format="JPEG")
    shards = tmp_path / "work" / "shards"
    shards.mkdir(parents=True)
    expected = write_hostile_tar(shards / "00000.tar", image.getvalue())
    cut = shards / "00001.tar"
    with tarfile.open(cut, "w") as tar:
        for k in range(3):
            tar_member(tar, f"kept{k}.jpg", image.getvalue())
            tar_member(tar, f"kept{k}.txt", b"kept")
    with tarfile.open(cut) as tar:
        inside = tar.getmember("kept2.jpg").offset_data + 100
    os.truncate(cut, inside)  # the tar now ends inside kept2.jpg's bytes
    before = snapshot(tmp_path)
    out = tmp_path / "work" / "out"
    done = bounded(run_measured("preprocess", str(shards), str(out), *ARGS, cwd=shards))
    assert done.returncode == 0, done.output
    attrs = load_attrs(out)
    reasons = {r["path"]: r["reason"] for r in attrs["rejects"]}
    for path, reason in expected.items():
        assert reason in reasons.pop(path), (path, reasons)
    assert "truncated" in reasons.pop(f"{cut}#kept2.jpg")
    assert "truncated" in reasons.pop(str(cut))
    assert reasons == {}
    assert attrs["accepted"] == 4  # good0, good1, kept0, kept1
    after = snapshot(tmp_path)
    ours = (str(out), str(out.parent / ".out.tilefeed-"))  # the store and the writer's lock beside it
    assert {p: v for p, v in after.items() if not p.startswith(ours)} == before
    assert not (tmp_path / "work" / "evil.jpg").exists() and not Path("/abs/evil.jpg").exists()


def test_a_parquet_footer_declaring_a_trillion_rows_is_refused_unread(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    bomb = parquet_declaring_rows(tmp_path / "bomb.parquet", 10**12)
    bounded(run_measured("preprocess", str(bomb), str(tmp_path / "out"), *ARGS)).refused(
        str(bomb), "declares 1000000000000 rows")
    assert not (tmp_path / "out" / "zarr.json").exists()


def test_a_caption_table_line_of_gigabytes_is_a_reject_read_in_bounded_memory(tmp_path: Path) -> None:
    """A row of 1.5 GiB (a sparse run of NULs) is skipped a bounded read at a time and rejected
    naming its line; a first line as long is no header, and the run is refused in one line."""
    photo(0, 40, 30).save(tmp_path / "0.jpg")
    table = tmp_path / "t.tsv"
    with open(table, "wb") as f:
        f.write(b"filepath\ttitle\n0.jpg\tfirst\n0.jpg\t")
        f.seek(1536 * MIB, os.SEEK_CUR)
        f.write(b"\n0.jpg\tlast\n")
    out = tmp_path / "out"
    done = bounded(run_measured("preprocess", str(table), str(out), *ARGS))
    assert done.returncode == 0, done.output
    attrs = load_attrs(out)
    assert {r["path"]: r["reason"] for r in attrs["rejects"]} == {
        f"{table}:3": f"a line over the {4 * MIB} bytes a row may hold"}
    assert attrs["accepted"] == 2
    head = tmp_path / "h.jsonl"
    with open(head, "wb") as f:
        f.write(b'{"filepath": "0.jpg", "title": "')
        f.seek(1536 * MIB, os.SEEK_CUR)
        f.write(b'"}\n')
    bounded(run_measured("preprocess", str(head), str(tmp_path / "out2"), *ARGS, "--source", "table")).refused(
        str(head), "lacks the image column")
