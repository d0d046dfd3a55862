"""The harness on a GPU: CUDA-event timing, calibrated device sleep, the bf16 model step.
Run by `make gpu-check` where CUDA is present, skipped cleanly elsewhere."""

from __future__ import annotations

import pytest
import torch

from tilefeed.bench.harness.watch import measure
from tilefeed.bench.harness.steps import EmulatedStep, ModelStep
from tests.helpers import DelayedLoader

pytestmark = pytest.mark.gpu


def test_device_sleep_is_timed_by_cuda_events_and_leaves_the_host_free() -> None:
    cuda = torch.device("cuda")
    run = measure(DelayedLoader(30), EmulatedStep(10, cuda), steps=12, warmup=2, device=cuda)
    assert run.step_median_ms == pytest.approx(10, rel=0.2)  # the GPU's time, not the host's
    # The host enqueues the step and goes on to wait for data, so one iteration takes 30 ms of
    # which the device works 10: it idles two thirds of the time.
    assert run.stall_fraction == pytest.approx(2 / 3, abs=0.1)
    assert run.samples_per_s == pytest.approx(4 / 0.030, rel=0.2)
    assert run.gpu_max_allocated_mb is not None and run.output["device"] == "cuda"


def test_a_fast_loader_keeps_the_device_busy() -> None:
    cuda = torch.device("cuda")
    run = measure(DelayedLoader(1), EmulatedStep(20, cuda), steps=12, warmup=2, device=cuda)
    assert run.stall_fraction < 0.1 and run.busy_fraction > 0.9


def test_model_step_on_the_device_in_bf16_autocast() -> None:
    cuda = torch.device("cuda")
    step = ModelStep(cuda, width=16, blocks=(1, 1), classes=10, accumulate=2)
    images = torch.randn(8, 3, 64, 64, device=cuda)
    labels = torch.randint(0, 10, (8,), device=cuda)
    step(images, labels)
    assert all(p.dtype == torch.float32 for p in step.model.parameters())  # fp32 master weights
    assert step.memory.params_mb > 0 and step.memory.activations_mb > 0
    assert "bf16 autocast" in step.describe()


@pytest.mark.parametrize("name", ["baseline", "dali-files", "tiles-dataloader", "tilefeed"])
def test_every_loader_feeds_the_device(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    from tilefeed.bench.peers.loaders import RowSettings, build_loader
    from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
    from tests.helpers import write_folder

    root = tmp_path_factory.mktemp("gpu-loaders")
    images = write_folder(root / "images", classes=2, per_class=8, size=(64, 48))
    store = root / "store"
    preprocess(images, store, TileSettings(tile=32), StoreSettings(codec="jpeg"), workers=1)
    cuda = torch.device("cuda")
    settings = RowSettings(images=images, store=store, batch_size=4, workers=1, size=32,
                              device=cuda)
    run = measure(build_loader(name, settings), EmulatedStep(5, cuda), steps=4, warmup=1,
                  device=cuda)
    assert run.output == {"shape": [3, 32, 32], "dtype": "float32", "device": "cuda"}


def test_the_decoder_probe_times_every_load_on_the_device(tmp_path_factory: pytest.TempPathFactory) -> None:
    from tilefeed.bench.suites.decoder_probe import LOADS, probe_decoder
    from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
    from tests.helpers import write_folder

    root = tmp_path_factory.mktemp("gpu-probe")
    images = write_folder(root / "images", classes=2, per_class=8, size=(64, 48))
    store = root / "store"
    preprocess(images, store, TileSettings(tile=32), StoreSettings(codec="jpeg"), workers=1)
    probe = probe_decoder(store, device_id=torch.cuda.current_device(), batch_size=8, batches=3, warmup=1)
    assert [(r.region, r.hw_decoder_load) for r in probe.runs] == [
        (region, load) for region in (False, True) for load in LOADS]
    whole = [r for r in probe.runs if not r.region]
    assert all(r.images_per_s > 0 and not r.error for r in whole), whole  # nvJPEG decodes whole tiles
    assert all(r.images_per_s > 0 or r.error for r in probe.runs)  # a window: measured or its error said
    assert probe.backend in ("hardware", "cuda") and probe.verdict.startswith("whole tiles: ")
    assert all(r.engine.available or r.engine.note for r in probe.runs)  # NVML read, or why not


def test_nvml_finds_the_device_cuda_calls_zero_and_the_soak_sees_every_allocator() -> None:
    """NVML by the device's UUID (NVML numbers the machine's GPUs, CUDA the visible ones); the
    device's used memory counts what torch's allocator does not reserve itself."""
    pynvml = pytest.importorskip("pynvml")
    from tilefeed.bench.suites.decoder_probe import nvml_uuid
    from tilefeed.bench.suites.soak import _device_used_kib

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByUUID(nvml_uuid(0))
    assert pynvml.nvmlDeviceGetName(handle)
    before = _device_used_kib()
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    assert _device_used_kib() - before >= 200 * 1024
    del block
