"""Which object-store client: obstore against fsspec's s3fs on the same objects and server.

Two read patterns the Loader uses: whole shards (the cache) and batches of tile-sized ranges of
one shard (random order with a small cache). Each client does each pattern in interleaved
rounds against the same local S3 server; medians and ranges are reported, in MB/s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tilefeed.bench.harness.sides import Figure, spread_text
from tilefeed.bench.fixtures.netem import CREDENTIALS, local_s3, s3_options
from tilefeed.store.object_storage import ObjectStorage

Reader = Callable[[str, list[int], list[int]], int]  # key, starts, ends -> bytes read


@dataclass
class ClientsResult:
    """Each client's MB/s on each read pattern, over interleaved rounds.

    ``mb_per_s`` maps client -> pattern (``whole``, ``ranged``) -> ``median``, ``min``, ``max``
    (``Figure.spread``).
    """

    shard_mb: float
    tiles: int
    tile_kb: float
    rounds: int
    mb_per_s: dict[str, dict[str, dict[str, float]]]

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return asdict(self)

    def table(self) -> str:
        """The figures as a Markdown table, one row per client."""
        lines = ["| client | whole shard MB/s (median, range) | tile ranges MB/s (median, range) |",
                 "|---|---|---|"]
        for client, f in self.mb_per_s.items():
            w, r = f["whole"], f["ranged"]
            lines.append(f"| {client} | {spread_text(w, '.0f')} | {spread_text(r, '.1f')} |")
        return "\n".join(lines)


def _obstore(url: str, endpoint: str) -> tuple[Callable[[str], int], Reader]:
    import obstore

    store = ObjectStorage(url, s3_options(endpoint)).store

    def ranges(key: str, starts: list[int], ends: list[int]) -> int:
        return sum(len(p) for p in obstore.get_ranges(store, key, starts=starts, ends=ends))

    return (lambda key: len(obstore.get(store, key).bytes())), ranges


def _s3fs(url: str, endpoint: str) -> tuple[Callable[[str], int], Reader]:
    import s3fs

    fs = s3fs.S3FileSystem(key=CREDENTIALS["AWS_ACCESS_KEY_ID"], secret=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                           client_kwargs={"endpoint_url": endpoint, "region_name": CREDENTIALS["AWS_REGION"]})
    base = url.removeprefix("s3://")

    def ranges(key: str, starts: list[int], ends: list[int]) -> int:
        # s3fs's own concurrent form: cat_ranges (one request per range, gathered)
        parts = fs.cat_ranges([f"{base}/{key}"] * len(starts), starts, ends)
        return sum(len(p) for p in parts)

    return (lambda key: len(fs.cat_file(f"{base}/{key}"))), ranges


def bench_clients(shard_mb: float = 16, tiles: int = 64, tile_kb: float = 20,
                  rounds: int = 5) -> ClientsResult:
    clients = {"obstore": _obstore}
    try:
        import s3fs  # noqa: F401

        clients["s3fs"] = _s3fs
    except ImportError:
        pass
    rng = np.random.default_rng(0)
    size, tile = int(shard_mb * 2**20), int(tile_kb * 1024)
    url = "s3://tilefeed/clients"
    found: dict[str, dict[str, list[float]]] = {c: {"whole": [], "ranged": []} for c in clients}
    with local_s3() as endpoint:
        ObjectStorage(url, s3_options(endpoint)).write(
            "shard", rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        made = {name: make(url, endpoint) for name, make in clients.items()}
        for _ in range(rounds):
            for name, (whole, ranged) in made.items():
                t = time.perf_counter()
                n = whole("shard")
                found[name]["whole"].append(n / 2**20 / (time.perf_counter() - t))
                starts = sorted(rng.choice(size // tile, tiles, replace=False) * tile)
                t = time.perf_counter()
                n = ranged("shard", [int(s) for s in starts], [int(s) + tile for s in starts])
                found[name]["ranged"].append(n / 2**20 / (time.perf_counter() - t))
    return ClientsResult(shard_mb=shard_mb, tiles=tiles, tile_kb=tile_kb, rounds=rounds,
                         mb_per_s={c: {p: Figure(v).spread() for p, v in patterns.items()}
                                   for c, patterns in found.items()})

