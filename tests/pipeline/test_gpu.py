"""GPU paths: run by `make gpu-check` where CUDA is present, skipped cleanly elsewhere."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline import Loader, StoreReader

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("codec_store", ["store", "jpeg_store"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.uint8])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_outputs_live_on_the_device(request: pytest.FixtureRequest, codec_store: str,
                                    dtype: torch.dtype, layout: str) -> None:
    store: Path = request.getfixturevalue(codec_store)
    with Loader(store, 8, dtype=dtype, layout=layout, size=24, with_index=True) as loader:
        assert loader.device.type == "cuda"
        seen = []
        for images, labels, idx in loader:
            assert images.device.type == "cuda" and labels.device.type == "cuda"
            assert images.dtype == dtype
            assert images.shape[1:] == ((3, 24, 24) if layout == "NCHW" else (24, 24, 3))
            seen += idx.tolist()
    assert sorted(seen) == list(range(50))


def test_mixed_decode_matches_the_stored_jpeg_tiles(jpeg_store: Path) -> None:
    reader = StoreReader(jpeg_store)
    with Loader(jpeg_store, 8, shuffle="none", train=False, size=32, dtype=torch.uint8,
                layout="NHWC", with_index=True) as loader:
        images, _, idx = next(iter(loader))
    for image, i in zip(images.cpu(), idx.cpu().tolist()):
        diff = image.numpy().astype(float) - reader.read(i).astype(float)
        assert 10 * np.log10(255**2 / max(np.mean(diff**2), 1e-9)) > 35


def test_lossless_eval_is_exact_on_the_device(store: Path) -> None:
    reader = StoreReader(store)
    with Loader(store, 8, shuffle="none", train=False, size=32, dtype=torch.uint8,
                layout="NHWC", with_index=True) as loader:
        for images, _, idx in loader:
            for image, i in zip(images.cpu(), idx.cpu().tolist()):
                np.testing.assert_array_equal(image.numpy(), reader.read(i))
