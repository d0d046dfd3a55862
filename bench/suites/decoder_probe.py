"""Which JPEG decoder did the work: the hardware JPEG engine, CUDA (nvJPEG's hybrid path) or the host.

DALI's ``mixed`` decoder sends a share of each batch (``hw_decoder_load``, 0.65 by default) to the
GPU's hardware JPEG engine where there is one and it can be reached, and decodes the rest with CUDA
kernels. Inside a container the engine needs the driver's ``video`` capability
(``NVIDIA_DRIVER_CAPABILITIES``); without it DALI falls back to CUDA decode without a word, and
region-of-interest decoding (``decoders.image_slice``; the Loader's graph decodes whole tiles)
may not use the engine at all. So the probe decodes one batch of the store's own tiles, whole and
as a window, at several loads, and reports for each the images/s and, where NVML can tell
(``nvidia-ml-py``), how busy the JPEG engine was. The verdict says which decoder ran and how that was known.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# 0: CUDA decode only; DALI's default; everything the engine can take
LOADS = (0.0, 0.65, 1.0)
# the engine counts as the faster path when it decodes this much faster than CUDA alone
SPEED_RULE = 1.2
WINDOW = (0.1, 0.9)  # the relative window a region-of-interest decode takes, each axis


@dataclass
class EngineUse:
    """How busy the hardware JPEG engine was over one run, as NVML sampled it."""

    available: bool
    note: str = ""
    peak_percent: float = 0.0
    mean_percent: float = 0.0
    samples: int = 0


def nvml_uuid(device_index: int) -> str:
    """NVML's name for CUDA device ``device_index`` as this process sees it: its UUID, in the
    ``GPU-...`` form NVML takes (torch gives it bare, and MIG slices with their own prefix)."""
    import torch

    uuid = str(torch.cuda.get_device_properties(device_index).uuid)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


class JpegEngineSampler:
    """``with JpegEngineSampler(index) as s: ...``: NVML's JPEG-engine utilisation sampled every
    ``period`` seconds on a thread; ``s.use`` after the block. Where NVML, its Python binding or its
    JPEG counter is missing, ``use.available`` is False and ``use.note`` says which."""

    def __init__(self, device_index: int | None, period: float = 0.02) -> None:
        self.index, self.period = device_index, period
        self.use = EngineUse(available=False, note="no CUDA device")
        self._values: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._read: Any = None

    def __enter__(self) -> JpegEngineSampler:
        if self.index is None:
            return self
        try:
            import pynvml

            pynvml.nvmlInit()
            # by the device's UUID: NVML numbers every GPU of the machine and ignores
            # CUDA_VISIBLE_DEVICES, which renumbers the ones CUDA (and DALI's device_id) see
            handle = pynvml.nvmlDeviceGetHandleByUUID(nvml_uuid(self.index))
            query = getattr(pynvml, "nvmlDeviceGetJpgUtilization", None)
            if query is None:
                self.use = EngineUse(available=False, note="this NVML binding has no JPEG counter")
                return self
            query(handle)  # raises where the driver or the device has no such counter
        except Exception as e:  # noqa: BLE001 - any NVML trouble is a note, never a failure
            self.use = EngineUse(available=False, note=f"NVML: {type(e).__name__}: {e}")
            return self
        self._read = lambda: float(query(handle)[0])
        self._thread = threading.Thread(target=self._poll, name="jpeg-engine-sampler", daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self._values.append(self._read())
            except Exception:  # noqa: BLE001 - a lost sample is not worth stopping the run
                continue

    def __exit__(self, *exc: object) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        v = self._values
        self.use = EngineUse(available=True, peak_percent=max(v, default=0.0),
                             mean_percent=float(np.mean(v)) if v else 0.0, samples=len(v))


@dataclass
class DecodeRun:
    """One decode setting timed: whole tiles or a window, at one ``hw_decoder_load``."""

    region: bool  # a window of each tile (the training path) rather than the whole tile
    hw_decoder_load: float | None  # None on the host, where there is no such setting
    images_per_s: float = 0.0
    engine: EngineUse = field(default_factory=lambda: EngineUse(available=False))
    error: str = ""


@dataclass
class DecoderProbe:
    """Every run of the probe on one store, and what they say about the decoder."""

    tile: int
    backend: str  # "hardware", "cuda", "host" or "unknown"
    verdict: str  # one line: which decoder, how it was known
    driver_capabilities: str | None
    runs: list[DecodeRun]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def verdict(runs: list[DecodeRun], *, gpu: bool, region: bool) -> tuple[str, str]:
    """(backend, one line) for the whole-tile (or windowed) runs: the engine's NVML counter when
    there is one, else the speed at load 1 against load 0."""
    if not gpu:
        return "host", "libjpeg-turbo on the host (no GPU)"
    by_load = {r.hw_decoder_load: r for r in runs if r.region == region and not r.error}
    full, none = by_load.get(1.0), by_load.get(0.0)
    if full is None or none is None:
        return "unknown", "a run at load 0 or 1 failed: see its error"
    if full.engine.available:
        if full.engine.peak_percent > 0:
            return "hardware", (f"hardware JPEG engine: NVML saw it {full.engine.peak_percent:.0f}% "
                                "busy at hw_decoder_load=1")
        return "cuda", "CUDA decode: NVML saw the JPEG engine idle at hw_decoder_load=1"
    ratio = full.images_per_s / none.images_per_s if none.images_per_s else 0.0
    if ratio >= SPEED_RULE:
        return "hardware", (f"hardware JPEG engine, inferred: load 1 decodes {ratio:.2f}x load 0 "
                            f"(NVML could not tell: {full.engine.note})")
    return "cuda", (f"CUDA decode, inferred: load 1 decodes {ratio:.2f}x load 0, under "
                    f"{SPEED_RULE}x (NVML could not tell: {full.engine.note})")


def probe_decoder(store: Path, *, device_id: int | None, batch_size: int = 256, batches: int = 20,
                  warmup: int = 3, threads: int = 4) -> DecoderProbe:
    """Decode one batch of ``store``'s JPEG tiles again and again at each load, whole and as a
    window, timing each setting; a setting that fails is recorded with its error."""
    from tilefeed.pipeline.reading.reader import StoreReader

    reader = StoreReader(store)
    if reader.codec.name != "jpeg":
        raise ValueError(f"the decoder probe needs a JPEG store; {store} is {reader.codec.name}")
    count = min(batch_size, len(reader))
    batch = [np.frombuffer(bytes(p), dtype=np.uint8) for p in reader.payloads(list(range(count)))]
    gpu = device_id is not None
    runs: list[DecodeRun] = []
    for region in (False, True):
        for load in (LOADS if gpu else (None,)):
            run = DecodeRun(region=region, hw_decoder_load=load)
            try:
                with JpegEngineSampler(device_id) as sampler:
                    run.images_per_s = _time_decode(batch, device_id=device_id, load=load, region=region,
                                                    batches=batches, warmup=warmup, threads=threads)
                run.engine = sampler.use
            except Exception as e:  # noqa: BLE001 - one setting failing must not stop the probe
                run.error = f"{type(e).__name__}: {e}"
            runs.append(run)
    backend, line = verdict(runs, gpu=gpu, region=False)
    _, windowed = verdict(runs, gpu=gpu, region=True)
    return DecoderProbe(tile=reader.tile, backend=backend, verdict=f"whole tiles: {line}; windows: {windowed}",
                        driver_capabilities=os.environ.get("NVIDIA_DRIVER_CAPABILITIES"), runs=runs)


def _time_decode(batch: list[np.ndarray], *, device_id: int | None, load: float | None, region: bool,
                 batches: int, warmup: int, threads: int) -> float:
    from nvidia.dali import fn, pipeline_def, types

    device = "cpu" if device_id is None else "mixed"
    tuning = {} if load is None else {"hw_decoder_load": load}

    @pipeline_def(batch_size=len(batch), num_threads=threads, device_id=device_id, prefetch_queue_depth=2)
    def decode() -> Any:
        raw = fn.external_source(source=lambda: batch, batch=True, dtype=types.UINT8)
        if region:
            return fn.decoders.image_slice(raw, rel_start=[WINDOW[0]] * 2, rel_end=[WINDOW[1]] * 2,
                                           axis_names="HW", device=device, output_type=types.RGB,
                                           **tuning)
        return fn.decoders.image(raw, device=device, output_type=types.RGB, **tuning)

    pipe = decode()
    pipe.build()
    try:
        for _ in range(warmup):
            pipe.run()
        start = time.perf_counter()
        for _ in range(batches):
            out = pipe.run()
        if device_id is not None:  # the last batch's kernels have finished before the clock stops
            out[0].as_cpu()
        return batches * len(batch) / (time.perf_counter() - start)
    finally:
        del pipe
