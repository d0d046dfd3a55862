"""Image-text sources read from real files: WebDataset shards in img2dataset's layout (with its
per-shard parquet of failed downloads), parquet files as pyarrow and Hugging Face ``datasets``
write them, and open_clip's caption tables. Every listed source's captions and fields are
checked by its key against what was written, and every reject carries its reason."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import photo, run_cli
from tilefeed.preprocess.sources.finding import Listing, decide, scan_sources
from tilefeed.preprocess.sources.scanning import PairOptions, SourceKind, SourceOptions
from tilefeed.preprocess.sources.webdataset import expand_braces
from tilefeed.store import format as fmt
from tilefeed.store.errors import SourceError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ARGS = ["--tile", "32", "--shard-size", "4", "--processes", "1", "--quiet"]


def jpeg(seed: int) -> bytes:
    out = io.BytesIO()
    photo(seed, 40, 30).save(out, format="JPEG", quality=90)
    return out.getvalue()


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_shards(root: Path, shards: int = 2,
                 per_shard: int = 4) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """img2dataset's output: NNNNN.tar of samples (KEY.jpg, KEY.txt, KEY.json) and NNNNN.parquet
    of every sample tried, two failed downloads a shard. Returns (key -> the caption and fields
    written, reject path -> the reason expected)."""
    root.mkdir(parents=True, exist_ok=True)
    written: dict[str, dict[str, Any]] = {}
    rejects: dict[str, str] = {}
    for s in range(shards):
        tar_path = root / f"{s:05d}.tar"
        rows: dict[str, list[Any]] = {"key": [], "status": [], "error_message": [], "caption": []}
        with tarfile.open(tar_path, "w") as tar:
            for i in range(per_shard):
                key = f"{s:05d}{i:04d}"
                caption = f"a photo number {s}-{i} of caf\u00e9 \u2615"
                meta = {"key": key, "caption": caption, "width": 40 + i, "height": 30,
                        "original_width": 400 + i, "original_height": 300.5, "status": "success", "url": f"http://x/{key}.jpg"}
                add(tar, f"{key}.jpg", jpeg(100 * s + i))
                add(tar, f"{key}.txt", caption.encode())
                add(tar, f"{key}.json", json.dumps(meta).encode())
                written[key] = {"caption": caption, "fields": {k: meta[k] for k in
                                                               ("key", "width", "height", "original_width",
                                                                "original_height")}}
                for column, value in (("key", key), ("status", "success"), ("error_message", None),
                                      ("caption", caption)):
                    rows[column].append(value)
            silent = f"{s:05d}{per_shard:04d}"  # an image without any caption
            add(tar, f"{silent}.jpg", jpeg(999))
            add(tar, f"{silent}.txt", b"  \n")
            add(tar, f"{silent}.json", json.dumps({"key": silent, "width": 40}).encode())
            rejects[f"{tar_path}#{silent}.jpg"] = "no caption: none of caption is given"
        for j, error in enumerate(("HTTP Error 404", "timed out")):
            key = f"{s:05d}{per_shard + 1 + j:04d}"
            for column, value in (("key", key), ("status", "failed_to_download"), ("error_message", error),
                                  ("caption", "lost")):
                rows[column].append(value)
            rejects[f"{tar_path}#{key}"] = f"download failed: {error}"
        pq.write_table(pa.table(rows), root / f"{s:05d}.parquet")
    return written, rejects


def key_of(path: str) -> str:
    """The WebDataset key of a listed tar member, or the file name's stem of a listed file."""
    return os.path.basename(path.split("#", 1)[-1]).split(".", 1)[0]


def by_key(listing: Listing, key: Any = key_of) -> dict[str, dict[str, Any]]:
    paths = [p.decode() for p in listing.files.paths()]
    assert listing.pairs is not None and listing.pairs.count == len(paths)
    return {key(p): {"path": p, **row} for p, row in zip(paths, listing.pairs.rows(), strict=True)}


def scan(src: str | Path, tmp_path: Path, pairs: PairOptions | None = None,
         options: SourceOptions | None = None) -> Listing:
    scratch = tmp_path / f"scratch-{len(list(tmp_path.glob('scratch-*')))}"
    scratch.mkdir()
    return scan_sources(src, scratch, options, pairs=pairs or PairOptions())


def check_shards(listing: Listing, written: dict[str, dict[str, Any]], rejects: dict[str, str]) -> None:
    found = by_key(listing)
    assert set(found) == set(written)
    for key, row in found.items():
        assert row["t"] == {"caption": written[key]["caption"]}, key
        assert row["f"] == written[key]["fields"], key
        member = row["m"]
        tar = row["path"].split("#", 1)[0]
        assert member["tar"] == os.path.realpath(tar)
        with open(tar, "rb") as f:
            f.seek(member["offset"])
            assert f.read(member["size"]) == jpeg(int(key[:5]) * 100 + int(key[5:]))
    assert dict(listing.skipped) == rejects
    assert listing.classes == ["image"] and set(listing.files.labels(0, len(listing)).tolist()) == {0}
    assert dict(listing.pairs.fields) == {"key": "string", "width": "int64", "height": "int64",  # type: ignore[union-attr]
                                          "original_width": "int64", "original_height": "float64"}


def test_webdataset_shards_by_pattern_folder_list_and_tar(tmp_path: Path) -> None:
    root = tmp_path / "shards"
    written, rejects = write_shards(root)
    pattern = str(root / "{00000..00001}.tar")
    listing = scan(pattern, tmp_path)
    check_shards(listing, written, rejects)
    assert "SRC read as webdataset shards (2 tars)" in listing.notes
    check_shards(scan(root, tmp_path), written, rejects)  # the folder: per-shard parquets are not a source
    (root / "shards.txt").write_text("00001.tar\n\n00000.tar\n")
    check_shards(scan(root / "shards.txt", tmp_path), written, rejects)
    one = scan(root / "00001.tar", tmp_path)
    assert set(by_key(one)) == {k for k in written if k.startswith("00001")}
    # another caption name, read from the .json; fields named; a label per sample
    named = scan(root, tmp_path, PairOptions(caption_key=("caption", "url"), fields=("url", "status"),
                                             label_key="width"))
    for key, row in by_key(named).items():
        assert row["t"] == {"caption": written[key]["caption"], "url": f"http://x/{key}.jpg"}
        assert row["f"] == {"url": f"http://x/{key}.jpg", "status": "success"}
    assert named.classes == [str(i) for i in range(44)]
    assert sorted(set(named.files.labels(0, len(named)).tolist())) == [40, 41, 42, 43]


def test_braces_expand_as_webdataset_expands_them() -> None:
    assert expand_braces("s/{00008..00010}.tar") == ["s/00008.tar", "s/00009.tar", "s/00010.tar"]
    assert expand_braces("{a,b}-{1..2}") == ["a-1", "a-2", "b-1", "b-2"]
    assert expand_braces("{3..1}{x}") == ["3{x}", "2{x}", "1{x}"]
    with pytest.raises(SourceError, match="shards"):
        expand_braces("{0..99999999}")


def test_auto_decides_and_refuses_an_ambiguous_folder(tmp_path: Path) -> None:
    root = tmp_path / "shards"
    write_shards(root, shards=1)
    assert decide(root, PairOptions()) is SourceKind.WEBDATASET
    assert decide(str(root / "{00000..00003}.tar"), PairOptions()) is SourceKind.WEBDATASET
    assert decide(root / "00000.parquet", PairOptions()) is SourceKind.PARQUET
    pq.write_table(pa.table({"image": [b"x"], "caption": ["c"]}), root / "other.parquet")
    with pytest.raises(SourceError, match="--source webdataset or --source parquet"):
        decide(root, PairOptions())
    (tmp_path / "m.csv").write_text("path,label\na.jpg,0\n")
    (tmp_path / "t.csv").write_text("filepath\ttitle\na.jpg\ta cat\n")
    (tmp_path / "comma.csv").write_text("filepath,title\na.jpg,a cat\n")
    (tmp_path / "m.jsonl").write_text('{"path": "a.jpg", "label": 1}\n')
    (tmp_path / "t.jsonl").write_text('{"filepath": "a.jpg", "title": "a cat"}\n')
    assert decide(tmp_path / "m.csv", PairOptions()) is SourceKind.MANIFEST
    assert decide(tmp_path / "m.csv", None) is SourceKind.MANIFEST
    assert decide(tmp_path / "t.csv", PairOptions()) is SourceKind.TABLE
    assert decide(tmp_path / "m.jsonl", PairOptions()) is SourceKind.MANIFEST
    assert decide(tmp_path / "t.jsonl", PairOptions()) is SourceKind.TABLE
    assert decide(tmp_path / "comma.csv", PairOptions(csv_separator=",")) is SourceKind.TABLE
    with pytest.raises(SourceError, match="--csv-separator ','"):
        decide(tmp_path / "comma.csv", PairOptions())
    assert decide("s3://bucket/{0..3}.tar", PairOptions()) is SourceKind.WEBDATASET
    assert decide("s3://bucket/x.parquet", PairOptions()) is SourceKind.PARQUET


def hf_metadata(image: str, caption: str) -> dict[bytes, bytes]:
    features = {image: {"_type": "Image"}, caption: {"dtype": "string", "_type": "Value"}}
    return {b"huggingface": json.dumps({"info": {"features": features}}).encode()}


def write_parquet_folder(folder: Path) -> Path:
    """Two parquet files as Hugging Face ``datasets`` marks them: ``a.parquet``, five rows of
    ``{bytes, path}`` pictures in row groups of two (row 3 without a caption), and
    ``b.parquet``, one row naming ``side.jpg`` beside it rather than holding its bytes."""
    folder.mkdir()
    (folder / "side.jpg").write_bytes(jpeg(7))
    images = [{"bytes": jpeg(i), "path": f"{i}.jpg"} for i in range(5)]
    captions = [f"row {i}" for i in range(5)]
    captions[3] = ""  # no caption: a reject
    schema = pa.schema([("picture", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                        ("text", pa.string()), ("width", pa.int64())], metadata=hf_metadata("picture", "text"))
    table = pa.table({"picture": images, "text": captions, "width": list(range(5))}, schema=schema)
    pq.write_table(table, folder / "a.parquet", row_group_size=2)
    side = pa.table({"picture": [{"bytes": None, "path": "side.jpg"}], "text": ["beside"], "width": [9]},
                    schema=schema)
    pq.write_table(side, folder / "b.parquet")
    return folder


def test_parquet_rows_of_bytes_and_paths(tmp_path: Path) -> None:
    folder = write_parquet_folder(tmp_path / "pq")
    pairs = PairOptions(caption_key=("text",), fields=("width",))
    listing = scan(folder, tmp_path, pairs)
    assert "SRC read as parquet (2 files)" in listing.notes
    found = by_key(listing, key=lambda p: p.split("#")[-1] if "#" in p else os.path.basename(p))
    a = os.path.abspath(folder / "a.parquet")
    assert dict(listing.skipped) == {f"{a}#3": "no caption: none of text is given"}
    for row in (0, 1, 2, 4):
        assert found[str(row)]["t"] == {"text": f"row {row}"} and found[str(row)]["f"] == {"width": row}
        assert found[str(row)]["m"] == {"parquet": os.path.realpath(folder / "a.parquet"), "group": row // 2,
                                        "row": row % 2, "column": "picture"}
    assert found["side.jpg"] == {"path": str(folder / "side.jpg"), "t": {"text": "beside"}, "f": {"width": 9},
                                 "m": None}
    # the worker's read of a member: this row's bytes
    from tilefeed.preprocess.sources.parquet import MemberReader

    reader = MemberReader()
    assert reader.read(found["4"]["m"]) == jpeg(4) and reader.read(found["1"]["m"]) == jpeg(1)
    done = run_cli("preprocess", str(folder), str(tmp_path / "out"), *ARGS, "--caption-key", "text",
                   "--fields", "width")
    assert done.returncode == 0, done.stderr
    store_captions(tmp_path / "out", {"0": "row 0", "1": "row 1", "2": "row 2", "4": "row 4", "side": "beside"},
                   key=lambda p: p.split("#")[-1] if "#" in p else Path(p).stem, name="text")


def test_a_parquet_written_by_hugging_face_datasets(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets", reason="needs Hugging Face datasets")
    features = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string")})
    # pictures in memory are stored as their bytes; a file's path, as the path (bytes null)
    (tmp_path / "x.jpg").write_bytes(jpeg(1))
    pictures = [photo(i, 40, 30) for i in range(3)] + [str(tmp_path / "x.jpg")]
    data = datasets.Dataset.from_dict({"image": pictures, "text": ["a", "b", "c", "d"]}, features=features)
    data.to_parquet(str(tmp_path / "hf.parquet"))
    listing = scan(tmp_path / "hf.parquet", tmp_path, PairOptions(caption_key=("text",)))
    found = by_key(listing, key=lambda p: p.split("#")[-1] if "#" in p else os.path.basename(p))
    assert {k: v["t"]["text"] for k, v in found.items()} == {"0": "a", "1": "b", "2": "c", "3": "d"}
    assert all(v["m"]["column"] == "image" for v in found.values())
    assert found["3"]["m"]["path"] == str(tmp_path / "x.jpg")  # read from the file, its bytes being null
    done = run_cli("preprocess", str(tmp_path / "hf.parquet"), str(tmp_path / "out"), *ARGS, "--caption-key",
                   "text")
    assert done.returncode == 0, done.stderr
    store_captions(tmp_path / "out", {"0": "a", "1": "b", "2": "c", "3": "d"},
                   key=lambda p: p.split("#")[-1], name="text")


def test_a_caption_table_as_open_clip_reads_it(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    lines = ["filepath\ttitle\twidth\tkey"]
    for i in range(4):
        photo(i, 40, 30).save(folder / f"{i}.jpg")
        lines.append(f"{i}.jpg\ta \"picture\" {i}\t{40 + i}\t{i:06d}")
    lines.append("0.jpg\tthe same picture, again\t40\t000000")  # a picture with two captions: two samples
    lines.append("3.jpg\t\t43\t000003")
    (folder / "train.tsv").write_text("\n".join(lines) + "\n")
    listing = scan(folder / "train.tsv", tmp_path)
    rows = [(p.decode(), r) for p, r in zip(listing.files.paths(), listing.pairs.rows(), strict=True)]  # type: ignore[union-attr]
    assert [(os.path.basename(p), r["t"]["caption"], r["f"]) for p, r in rows] == [
        *[(f"{i}.jpg", f'a "picture" {i}', {"width": 40 + i, "key": f"{i:06d}"}) for i in range(4)],
        ("0.jpg", "the same picture, again", {"width": 40, "key": "000000"})]
    assert listing.skipped == [(str(folder / "3.jpg"), "no caption: none of caption is given")]
    assert rows[0][1]["m"] is None
    (tmp_path / "outside.tsv").write_text("filepath\ttitle\ndata/0.jpg\tok\n")
    scan(tmp_path / "outside.tsv", tmp_path)  # inside its folder
    with pytest.raises(SourceError, match="outside the manifest's folder"):
        (folder / "up.tsv").write_text("filepath\ttitle\n../outside.tsv\tno\n")
        scan(folder / "up.tsv", tmp_path)


def store_captions(out: Path, expected: dict[str, str], key: Any = key_of, name: str = "caption") -> None:
    """The store's captions, by key of their source, are ``expected`` (when the store holds them)."""
    import zarr

    from tilefeed.store.documents import load_attrs
    from tilefeed.store.pairs import read_pairs

    attrs = load_attrs(out)
    assert attrs["accepted"] == len(expected)
    paths = [str(p) for p in zarr.open_group(str(out), mode="r")[fmt.SOURCE_PATHS][:]]  # type: ignore[index,union-attr]
    texts = read_pairs(out, attrs).texts
    if name in texts:
        assert {key(p): str(t) for p, t in zip(paths, texts[name], strict=True)} == expected


def test_preprocess_runs_on_webdataset_shards(tmp_path: Path) -> None:
    written, rejects = write_shards(tmp_path / "shards")
    out = tmp_path / "out"
    done = run_cli("preprocess", str(tmp_path / "shards" / "{00000..00001}.tar"), str(out), *ARGS[:-1])
    assert done.returncode == 0, done.stderr
    # said as soon as the scan has read SRC, before the summary
    assert done.stderr.startswith("tilefeed: SRC read as webdataset shards (2 tars)\n"), done.stderr
    assert "SRC read as" not in done.stdout
    assert f"accepted {len(written)}, rejected {len(rejects)}" in done.stdout
    store_captions(out, {k: v["caption"] for k, v in written.items()})
    from tilefeed.store.documents import load_attrs

    assert {r["path"]: r["reason"] for r in load_attrs(out)["rejects"]} == rejects
    # OUT inside the folder of shards: left out of the scan, and a rerun finds the store complete
    inside = tmp_path / "shards" / "out"
    for _ in range(2):
        done = run_cli("preprocess", str(tmp_path / "shards"), str(inside), *ARGS[:-1])
        assert done.returncode == 0, done.stderr
    assert "already complete" in done.stdout


def test_a_bad_parquet_file_is_a_reject_and_the_others_are_read(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from tilefeed.preprocess.sources import parquet

    folder = tmp_path / "pq"
    folder.mkdir()
    pictures = pa.table({"image": [jpeg(i) for i in range(10)], "caption": [f"c{i}" for i in range(10)]})
    pq.write_table(pictures, folder / "a-good.parquet", row_group_size=4)
    pq.write_table(pictures, folder / "b-big.parquet")
    (folder / "c-notes.parquet").write_bytes(b"just some notes")
    pq.write_table(pa.table({"other": [1]}), folder / "d-columns.parquet")
    (folder / "e-cut.parquet").write_bytes((folder / "a-good.parquet").read_bytes()[:-100])
    pq.write_table(pictures, folder / "f-damaged.parquet", row_group_size=4)
    meta = pq.ParquetFile(folder / "f-damaged.parquet").metadata
    with open(folder / "f-damaged.parquet", "r+b") as f:  # group 1's captions: a page header of garbage
        f.seek(meta.row_group(1).column(1).data_page_offset)
        f.write(b"\xff" * 16)
    monkeypatch.setattr(parquet, "MAX_GROUP_BYTES", 7000)  # ten pictures take more, four less
    monkeypatch.setattr(parquet, "BATCH_ROWS", 3)  # batches that cross no group
    listing = scan(folder, tmp_path)
    found = by_key(listing, key=lambda p: p.rsplit("/", 1)[-1])
    good = [f"a-good.parquet#{i}" for i in range(10)]
    assert list(found) == [*good, "f-damaged.parquet#0", "f-damaged.parquet#1", "f-damaged.parquet#2",
                           "f-damaged.parquet#3"]
    assert [found[k]["m"]["row"] for k in good] == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert [found[k]["t"]["caption"] for k in good] == [f"c{i}" for i in range(10)]
    reasons = {os.path.basename(p): r for p, r in listing.skipped}
    assert "row group 0 declares" in reasons.pop("b-big.parquet")
    assert "no PAR1 footer" in reasons.pop("c-notes.parquet")
    assert "no image column 'image'" in reasons.pop("d-columns.parquet")
    assert "not a parquet file" in reasons.pop("e-cut.parquet")
    assert "row group 1 cannot be read after 4 rows (those kept)" in reasons.pop("f-damaged.parquet")
    assert reasons == {}
    # a row group whose image column a worker could not hold: its rows are one reject
    monkeypatch.setattr(parquet, "MAX_IMAGE_GROUP_BYTES", 2 * len(jpeg(0)) + 100)
    pq.write_table(pa.table({"image": [jpeg(0), jpeg(1), b"", b"x"], "caption": list("abcd")}),
                   tmp_path / "g.parquet", row_group_size=2)
    listing = scan(tmp_path / "g.parquet", tmp_path)
    g = os.path.abspath(tmp_path / "g.parquet")
    assert [p.decode() for p in listing.files.paths()] == [f"{g}#2", f"{g}#3"]
    assert listing.skipped[0][0] == f"{g}#0-1"
    assert "row group 0: its image column declares" in listing.skipped[0][1]
    with pytest.raises(ValueError, match="a worker holds"):
        parquet.MemberReader().read({"parquet": g, "group": 0, "row": 0, "column": "image"})


def test_a_container_rewritten_in_place_changes_the_run(tmp_path: Path) -> None:
    """A member records where its bytes lie, not what they are: the container's size and time of
    change are in the table's digest, and a rerun over a rewritten file makes a new store."""
    written, _ = write_shards(tmp_path / "shards", shards=1)
    tar = tmp_path / "shards" / "00000.tar"
    before = scan(tar, tmp_path).pairs.digest  # type: ignore[union-attr]
    assert scan(tar, tmp_path).pairs.digest == before  # type: ignore[union-attr]
    os.utime(tar, ns=(1, 1))
    assert scan(tar, tmp_path).pairs.digest != before  # type: ignore[union-attr]
    import zarr

    def write(seed: int) -> None:
        pictures = [jpeg(seed + i) for i in range(4)]
        pq.write_table(pa.table({"image": pictures, "caption": list("abcd")}), tmp_path / "p.parquet")

    def images(out: Path) -> Any:
        return zarr.open_group(str(out), mode="r")[fmt.IMAGES][:]  # type: ignore[index]

    write(0)
    out = tmp_path / "out"
    done = run_cli("preprocess", str(tmp_path / "p.parquet"), str(out), *ARGS)
    assert done.returncode == 0, done.stderr
    old = images(out)
    write(50)  # other pictures, the same captions
    done = run_cli("preprocess", str(tmp_path / "p.parquet"), str(out), *ARGS[:-1])
    assert done.returncode == 1 and "made from other sources or settings" in done.stderr, done.stderr
    done = run_cli("preprocess", str(tmp_path / "p.parquet"), str(out), *ARGS[:-1], "--overwrite")
    assert done.returncode == 0, done.stderr
    assert "already complete" not in done.stdout
    fresh = tmp_path / "fresh"
    assert run_cli("preprocess", str(tmp_path / "p.parquet"), str(fresh), *ARGS).returncode == 0
    assert (images(out) == images(fresh)).all() and not (images(out) == old).all()


def test_a_sample_of_too_many_members_is_a_reject(tmp_path: Path) -> None:
    from tilefeed.preprocess.sources.webdataset import MAX_SAMPLE_MEMBERS

    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w") as tar:
        add(tar, "many.jpg", jpeg(1))
        add(tar, "many.txt", b"a caption")
        for k in range(100):
            add(tar, f"many.x{k}", b"")
        add(tar, "fine.jpg", jpeg(2))
        add(tar, "fine.txt", b"fine")
    listing = scan(shard, tmp_path)
    assert [key_of(p.decode()) for p in listing.files.paths()] == ["fine"]
    assert listing.skipped == [(f"{shard}#many.x{MAX_SAMPLE_MEMBERS - 2}",
                                f"more than the {MAX_SAMPLE_MEMBERS} members a sample may hold")]


def test_caption_table_rows_that_cannot_be_read_are_rejects_naming_their_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tilefeed.preprocess.sources import table

    photo(0, 40, 30).save(tmp_path / "0.jpg")
    rows = [b"filepath\ttitle", b"0.jpg\tfirst", b"0.jpg\t" + b"x" * 200_000, b"\tno path",
            b"0.jpg\tcaf\xe9", b"0.jpg\t" + b"y" * 500_000, b"0.jpg\tlast"]
    (tmp_path / "t.tsv").write_bytes(b"\n".join(rows) + b"\n")
    monkeypatch.setattr(table, "MAX_LINE_BYTES", 300_000)
    listing = scan(tmp_path / "t.tsv", tmp_path)
    assert [r["t"]["caption"] for r in listing.pairs.rows()] == ["first", "last"]  # type: ignore[union-attr]
    where = f"{tmp_path / 't.tsv'}"
    assert listing.skipped == [(f"{where}:3", "unreadable row: field larger than field limit (131072)"),
                               (f"{where}:4", "no image path in 'filepath'"),
                               (f"{where}:5", "not UTF-8 text"),
                               (f"{where}:6", "a line over the 300000 bytes a row may hold")]
    lines = [b'{"filepath": "0.jpg", "title": "one"}', b"{not json", b"[1, 2]", b"[" * 100_000,
             b'{"title": "no path"}', b'{"filepath": "0.jpg", "title": "two"}']
    (tmp_path / "t.jsonl").write_bytes(b"\n".join(lines))
    monkeypatch.setattr(table, "MAX_LINE_BYTES", 1 << 20)
    listing = scan(tmp_path / "t.jsonl", tmp_path)
    assert [r["t"]["caption"] for r in listing.pairs.rows()] == ["one", "two"]  # type: ignore[union-attr]
    where = f"{tmp_path / 't.jsonl'}"
    assert listing.skipped == [(f"{where}:2", "not a JSON object"), (f"{where}:3", "not a JSON object"),
                               (f"{where}:4", "not a JSON object"),
                               (f"{where}:5", "no image path in 'filepath'")]
    # deciding what a file is reads a bounded prefix: a first line past it is no header
    monkeypatch.setattr(table, "MAX_HEADER_BYTES", 64)
    (tmp_path / "long.csv").write_text("filepath\ttitle" + "\tz" * 40 + "\n0.jpg\tok\n")
    assert table.header(tmp_path / "long.csv", PairOptions()) == []
    assert table.header(tmp_path / "t.jsonl", PairOptions()) == ["filepath", "title"]


def _reference_pairs(root: Path, group: Any, table: Any) -> list[str]:
    """The captions' and fields' arrays as they were written one array at a time, each from a
    pass of its own over the table: what the one-pass writer must match byte for byte."""
    import math

    import numpy as np

    from tilefeed.preprocess import metadata

    def values(name: str, text: bool, dtype: str, rows: int) -> Any:
        held: list[Any] = []
        for record in table.rows():
            value = (record["t"] if text else record["f"]).get(name)
            if dtype == "string":
                value = "" if value is None else value if isinstance(value, str) else json.dumps(
                    value, ensure_ascii=False)
            elif value is None:
                value = math.nan if dtype == "float64" else 0
            else:
                value = float(value) if dtype == "float64" else int(value)
            held.append(value)
            if len(held) == rows:
                yield held
                held = []
        if held:
            yield held

    names = []
    for name, text in [*((n, True) for n in table.texts), *((n, False) for n, _ in table.fields)]:
        array = fmt.text_array(name) if text else fmt.field_array(name)
        dtype = "string" if text else dict(table.fields)[name]
        if dtype == "string":
            chunk = min(table.count, fmt.TEXT_CHUNK if text else fmt.PATHS_CHUNK)
            metadata._string_array(group, array, table.count, chunk)
            for index, held in enumerate(values(name, text, dtype, chunk)):
                metadata._write_chunk(root, array, index, metadata._paths_chunk(held, chunk))
        else:
            writer = metadata._RowWriter(metadata._small_array(group, array, table.count, dtype),
                                         fmt.SMALL_CHUNK)
            for held in values(name, text, dtype, fmt.SMALL_CHUNK):
                writer.add(np.array(held, dtype=dtype))
            writer.close()
        names.append(array)
    return names


@pytest.mark.parametrize("count", [0, 1, 37])
def test_the_pair_arrays_are_written_in_one_pass_byte_for_byte_as_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    import zarr

    from tilefeed.preprocess import metadata
    from tilefeed.preprocess.sources.pairs import PairTable, PairTableWriter

    monkeypatch.setattr(fmt, "TEXT_CHUNK", 4)  # several chunks of each array, the last one short
    monkeypatch.setattr(fmt, "PATHS_CHUNK", 8)
    monkeypatch.setattr(fmt, "SMALL_CHUNK", 16)
    writer = PairTableWriter(tmp_path / "table", ("caption", "alt"), ("width", "score", "key", "meta"), False)
    for i in range(count):
        texts = {"caption": f"caf\u00e9 {i}" * (i % 5), **({"alt": f"alt {i}"} if i % 3 else {})}
        fields = {"width": i * 7 if i % 4 else None, "score": (i / 3 if i % 2 else i), "key": f"{i:06d}",
                  "meta": {"n": i} if i % 5 == 0 else (i if i % 5 == 1 else None)}
        writer.add(texts, fields, None)
    table: PairTable = writer.close()
    reads = []
    real_rows = PairTable.rows
    monkeypatch.setattr(PairTable, "rows", lambda self: reads.append(1) or real_rows(self))
    built = {}
    strings = len(table.texts) + sum(dtype == "string" for _, dtype in table.fields)
    # one pass; then a pass budget below any string chunk: a pass per string array (of any rows)
    for how, write, budget, passes in (("one pass", metadata._write_pairs, metadata.PASS_BYTES, 1),
                                       ("a pass each", metadata._write_pairs, 1, strings if count else 1),
                                       ("reference", _reference_pairs, 0, 6)):
        monkeypatch.setattr(metadata, "PASS_BYTES", budget)
        root = tmp_path / how
        group = zarr.open_group(str(root), mode="a", zarr_format=3)
        reads.clear()
        names = write(root, group, table)
        assert len(reads) == passes  # the table is read once for every array of a pass
        built[how] = (names, {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
                              if p.is_file()})
    for how in ("one pass", "a pass each"):
        assert built[how][0] == built["reference"][0]
        assert built[how][1].keys() == built["reference"][1].keys()
        for name, data in built[how][1].items():
            assert data == built["reference"][1][name], (how, name)


def test_a_parquet_source_of_only_bad_files_holds_no_images(tmp_path: Path) -> None:
    (tmp_path / "pq").mkdir()
    (tmp_path / "pq" / "a.parquet").write_bytes(b"just some notes")
    (tmp_path / "pq" / "b.parquet").write_bytes(b"PAR1")
    with pytest.raises(SourceError, match=r"holds no images: .*a.parquet' is not a parquet file "
                                          r"\(no PAR1 footer\) \(and 1 other file, each a reject\)"):
        scan(tmp_path / "pq", tmp_path)
