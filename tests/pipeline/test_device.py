"""The device paths: on DALI's CPU backend in the device shape in every run, on CUDA where it is
present (`make gpu-check`), skipped cleanly elsewhere."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tilefeed.pipeline import Loader, StoreReader
from tests.helpers import device_sides, on_side, psnr



@pytest.mark.parametrize("codec_store", ["store", "jpeg_store"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.uint8])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("side", device_sides())
def test_outputs_live_on_the_device(request: pytest.FixtureRequest, codec_store: str,
                                    dtype: torch.dtype, layout: str, train: bool, side: str) -> None:
    store: Path = request.getfixturevalue(codec_store)
    with on_side(side) as device, Loader(store, 8, dtype=dtype, layout=layout, size=24, train=train,
                                         with_index=True, device=device) as loader:
        assert loader.device.type == device
        seen = []
        for images, labels, idx in loader:
            assert images.device.type == labels.device.type == idx.device.type == device
            assert images.dtype == dtype
            assert images.shape[1:] == ((3, 24, 24) if layout == "NCHW" else (24, 24, 3))
            seen += idx.tolist()
    assert sorted(seen) == list(range(50))


@pytest.mark.parametrize("side", device_sides())
def test_eval_tiles_on_the_device_match_the_store(store: Path, jpeg_store: Path, side: str) -> None:
    """Lossless tiles exactly; JPEG tiles through the graph's decoder (nvJPEG on a GPU, its
    chroma upsampled as libjpeg-turbo's) within a PSNR bound and a level on average of the
    host's libjpeg-turbo decode."""
    for path in (store, jpeg_store):
        reader = StoreReader(path)
        with on_side(side) as device, Loader(path, 8, shuffle="none", train=False, size=32, dtype=torch.uint8,
                                             layout="NHWC", with_index=True, device=device) as loader:
            for images, _, idx in loader:
                assert images.device.type == device
                for image, i in zip(images.cpu(), idx.cpu().tolist(), strict=True):
                    if reader.is_image_coded:
                        host = reader.read(i)
                        assert psnr(image.numpy(), host) > 35
                        assert np.abs(image.numpy().astype(np.int16) - host).mean() < 1.0
                    else:
                        np.testing.assert_array_equal(image.numpy(), reader.read(i))


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fast_idct_is_accepted_on_the_device(jpeg_store: Path, train: bool) -> None:
    """nvJPEG decodes whole tiles (eval) and crop windows (train) with the setting in the graph;
    it only reaches libjpeg-turbo's fallback, so the images are exactly the accurate IDCT's."""
    def first_batch(fast_idct: bool) -> tuple[np.ndarray, list[int]]:
        with Loader(jpeg_store, 8, shuffle="none", train=train, size=32, dtype=torch.uint8,
                    layout="NHWC", with_index=True, fast_idct=fast_idct) as loader:
            images, _, idx = next(iter(loader))
            assert images.device.type == "cuda"
            return images.cpu().numpy(), idx.cpu().tolist()

    (fast, fast_idx), (accurate, accurate_idx) = first_batch(True), first_batch(False)
    assert fast_idx == accurate_idx
    np.testing.assert_array_equal(fast, accurate)


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("side", device_sides())
def test_a_mixture_runs_one_graph_on_the_device(jpeg_store: Path, train: bool, side: str) -> None:
    """Two JPEG stores through the graph's decoder (nvJPEG on a GPU) in one graph: every position
    once, each tile its store's."""
    from collections import Counter

    from tilefeed.pipeline import Mix

    mix = Mix({"a": jpeg_store, "b": jpeg_store}, weights={"a": 1, "b": 1}, labels="offset")
    reader = StoreReader(jpeg_store)
    with on_side(side) as device, Loader(mix, 8, shuffle=True, train=train, size=32, dtype=torch.uint8,
                                         layout="NHWC", with_index=True, device=device) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            graph, counts = loader._graph, Counter[str]()
            for images, labels, idx in loader:
                assert images.device.type == labels.device.type == device
                names, samples = loader.source_of(idx.cpu())
                counts.update(names)
                for image, name, sample, label in zip(images.cpu().numpy(), names, samples.tolist(),
                                                      labels.cpu().tolist(), strict=True):
                    assert label == int(reader.labels[sample]) + (0 if name == "a" else len(reader.classes))
                    if not train:
                        assert psnr(image, reader.read(sample)) > 35
            assert loader._graph is graph  # one graph for both stores, kept across epochs
            assert counts == {"a": 50, "b": 50}
