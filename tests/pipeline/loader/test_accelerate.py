"""Hugging Face accelerate around the Loader, as its users write it: ``prepare`` hands the Loader
back, ``register_for_checkpointing`` makes ``save_state``/``load_state`` carry its position, and a
resumed run delivers exactly what the interrupted one had not."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tilefeed.pipeline import Loader

OPTIONS = dict(train=True, seed=3, with_index=True, num_workers=1, size=24)


def test_prepare_returns_the_loader_and_save_state_resumes_it_exactly(store: Path, tmp_path: Path) -> None:
    from accelerate import Accelerator

    with Loader(store, 8, **OPTIONS) as loader:  # type: ignore[arg-type]
        whole = [(images.clone(), idx.clone()) for images, _, idx in loader]

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Loader(store, 8, **OPTIONS) as loader:  # type: ignore[arg-type]
        model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
        assert prepared is loader
        accelerator.register_for_checkpointing(loader)
        first = []
        for n, (images, _, idx) in enumerate(loader):
            first.append((images.clone(), idx.clone()))
            if n == 2:
                accelerator.save_state(str(tmp_path / "checkpoint"))
                break

    resumed = Accelerator(cpu=True)
    with Loader(store, 8, **OPTIONS) as loader:  # type: ignore[arg-type]
        resumed.register_for_checkpointing(loader)
        resumed.load_state(str(tmp_path / "checkpoint"))
        rest = [(images.clone(), idx.clone()) for images, _, idx in loader]
    assert len(first) + len(rest) == len(whole)
    for (a, ia), (b, ib) in zip(first + rest, whole, strict=True):
        assert torch.equal(ia, ib) and torch.equal(a, b)


TRAIN = """
import json, os, signal, sys

import torch
from accelerate import Accelerator

from tilefeed import Loader

store, checkpoint, out, phase = sys.argv[1:5]
accelerator = Accelerator(cpu=True)  # under torchrun: the gloo group of the launched processes
loader = Loader(store, 4, train=True, seed=3, with_index=True, num_workers=1, size=24)
model = torch.nn.Linear(3, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
accelerator.register_for_checkpointing(loader)
if phase == "resume":
    accelerator.load_state(checkpoint)
seen = []
rank = accelerator.process_index
for n, (images, labels, indices) in enumerate(loader):
    loss = model(images.mean(dim=(2, 3))).logsumexp(1).mean()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    seen += indices.tolist()
    if phase == "first" and n == 2:
        accelerator.save_state(checkpoint)
        json.dump({"rank": rank, "world": loader.world_size, "seen": seen}, open(f"{out}-{rank}.json", "w"))
        accelerator.wait_for_everyone()
        os.kill(os.getpid(), signal.SIGKILL)
json.dump({"rank": rank, "world": loader.world_size, "seen": seen}, open(f"{out}-{rank}.json", "w"))
"""


@pytest.mark.slow
def test_two_processes_killed_and_resumed_through_accelerate_deliver_every_sample_once(
        store: Path, tmp_path: Path) -> None:
    """torchrun with two CPU processes around accelerate's loop (prepare, register_for_checkpointing,
    backward, save_state after three batches, then SIGKILL); a second launch that load_states the
    checkpoint finishes the epoch: every sample of the epoch exactly once over both launches and
    both processes, none twice."""
    import subprocess
    import sys

    from tests.helpers import free_port

    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[3] / "src"),
                                                         os.environ.get("PYTHONPATH", "")])}
    for phase in ("first", "resume"):
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                               "--master_port", str(free_port()), str(script), str(store),
                               str(tmp_path / "checkpoint"), str(tmp_path / phase), phase],
                              env=env, capture_output=True, text=True, timeout=600)
        assert (done.returncode != 0) == (phase == "first"), done.stdout + done.stderr  # killed, then whole
    runs = [json.loads((tmp_path / f"{phase}-{rank}.json").read_text()) for phase in ("first", "resume")
            for rank in (0, 1)]
    assert all(r["world"] == 2 for r in runs)
    first = [i for r in runs[:2] for i in r["seen"]]
    rest = [i for r in runs[2:] for i in r["seen"]]
    assert len(first) == 2 * 3 * 4 and len(set(first)) == len(first)
    assert sorted(first + rest) == list(range(50)), (sorted(first), sorted(rest))
