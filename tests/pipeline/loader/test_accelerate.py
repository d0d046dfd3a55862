"""Hugging Face accelerate around the Loader, as its users write it: ``prepare`` hands the Loader
back, ``register_for_checkpointing`` makes ``save_state``/``load_state`` carry its position, and a
resumed run delivers exactly what the interrupted one had not."""

from __future__ import annotations

from pathlib import Path

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
