"""What only CUDA does in the engine, in one place: the rest of the graph is the same code on
both devices.

The Loader builds one graph whether it runs on a GPU or, in the device shape
(``TILEFEED_DEVICE_GRAPH=1``, see ``pipeline.device``), on DALI's CPU backend; the two differ
by what is here alone:

- where the graph decodes and works: DALI's ``mixed`` decoder (nvJPEG) and one host-to-device
  copy of lossless tiles on a GPU, the ``cpu`` backend otherwise (``decoder``, ``upload``);
  every other operator follows its inputs' device, DALI's arithmetic moves its CPU operands to
  the GPU itself, and a constant given to an operator lands on the operator's device;
- the hand-over's side stream (``SideStream``): the batch taken from DALI (``torch.from_dlpack``,
  DALI ordering its work before the side stream) and copied once into memory of torch's caching
  allocator, its per-batch work run on that stream, and an event the consumer's stream waits
  on. The copy is what keeps the batch safe: DALI's own buffer returns to DALI's pool when the
  last tensor on it goes, with no knowledge of the training stream's kernels still queued on it,
  and torch's ``record_stream`` does nothing for memory torch did not allocate; a batch cast
  (bf16) is that copy already;
- pinned host memory for the ring of lossless tiles the graph copies to the device
  (``host_buffer``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

def decoder(gpu: bool) -> str:
    """DALI's device for the graph's JPEG decoder: ``mixed`` (nvJPEG) with a GPU, else ``cpu``."""
    return "mixed" if gpu else "cpu"


def upload(node: Any, gpu: bool) -> Any:
    """Lossless tiles (or any CPU node) on the graph's device: one host-to-device copy a batch."""
    return node.gpu() if gpu else node


def host_buffer(nbytes: int, pinned: bool) -> np.ndarray:
    """``nbytes`` of host memory for tiles the graph reads in place, page-locked where the graph
    copies them to a GPU (a pinned source lets the copy run asynchronously at full speed)."""
    if pinned:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()
    return np.empty(nbytes, dtype=np.uint8)


class SideStream:
    """The feeding thread's CUDA stream: DALI runs on it and the hand-over's work runs on it,
    off the consumer's stream, which waits only for the event each batch carries."""

    def __init__(self, device: torch.device) -> None:
        torch.cuda.set_device(device)
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def run(self, pipe: Any) -> Any:
        """One run of the graph, its GPU work ordered on the side stream."""
        return pipe.run(self.stream)

    def hand_over(self, outputs: Sequence[Any], host: Callable[[Any], torch.Tensor],
                  finish: Callable[[dict[str, torch.Tensor]], None],
                  cast: bool) -> tuple[dict[str, torch.Tensor], Any]:
        """The batch out of DALI: the images copied once from DALI's device buffer into torch's
        memory (by ``finish``'s cast where ``cast``, else here), the labels and indices from the
        host outputs (``host`` makes a CPU tensor of a DALI output); ``finish`` then casts and
        applies the per-batch work reading ``indices`` on the host, and the labels and indices
        follow the images to the device. Returns the batch and the event that marks it ready."""
        images, labels, indices = outputs
        with torch.cuda.stream(self.stream):
            # DALI orders its work before the current (side) stream through the DLPack protocol
            pixels = torch.from_dlpack(images.as_tensor())
            out = {"images": pixels if cast else pixels.clone(),
                   "labels": host(labels).to(self.device, non_blocking=True),
                   "indices": host(indices)}
            finish(out)
            out["indices"] = out["indices"].to(self.device, non_blocking=True)
            ready = self.stream.record_event()
        # the copy and the per-batch work done before DALI's buffer goes back to its pool (with
        # ``pixels``) and before the next run reuses the side stream
        ready.synchronize()
        return out, ready

    def handed(self, out: dict[str, Any], ready: Any, tensors: Callable[[Any], Any]) -> None:
        """On the consumer's thread: its current stream waits for the batch, and the batch's
        device memory (torch's caching allocator's) is marked in use by that stream, so the
        allocator keeps it until the stream's queued work on it is done."""
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(ready)
        for tensor in tensors(out):
            if tensor.is_cuda:
                tensor.record_stream(stream)
