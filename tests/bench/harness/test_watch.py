from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch

from tilefeed.bench.suites.compare import UnfairComparison, fairness
from tilefeed.bench.harness.watch import measure, watch
from tilefeed.bench.harness.steps import EmulatedStep, ModelStep
from tests.helpers import DelayedLoader

CPU = torch.device("cpu")


class FakeClock:
    """Seconds that pass only when a test says so: timing figures become exact."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += ms / 1000


class ClockedLoader:
    """Each batch takes ``wait_ms`` of the fake clock to arrive."""

    def __init__(self, clock: FakeClock, wait_ms: float, batches: int = 1000, batch: int = 4) -> None:
        self.clock, self.wait_ms, self.batches, self.batch = clock, wait_ms, batches, batch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self.batches):
            self.clock.advance(self.wait_ms)
            yield torch.zeros(self.batch, 3, 8, 8), torch.zeros(self.batch, dtype=torch.int64)


@pytest.mark.parametrize("wait_ms,step_ms", [(30, 10), (5, 25)])
def test_measured_wait_and_stall_are_exact_on_a_fake_clock(wait_ms: float, step_ms: float) -> None:
    clock = FakeClock()
    run = measure(ClockedLoader(clock, wait_ms), lambda images, labels: clock.advance(step_ms),
                  steps=12, warmup=2, device=CPU, clock=clock)
    assert run.steps == 12 and run.samples == 48 and run.batch_size == 4 and run.warmup == 2
    assert run.wait_median_ms == pytest.approx(wait_ms) and run.step_median_ms == pytest.approx(step_ms)
    assert run.stall_fraction == pytest.approx(wait_ms / (wait_ms + step_ms))
    assert run.busy_fraction == pytest.approx(step_ms / (wait_ms + step_ms))
    assert run.samples_per_s == pytest.approx(4 / ((wait_ms + step_ms) / 1000))
    assert run.wall_s == pytest.approx(run.wait_s + run.step_s + run.h2d_s)


class ColdStartLoader:
    """Epochs of ``batches`` batches whose first one takes ``first_ms``, the others ``ms``."""

    def __init__(self, clock: FakeClock, first_ms: float, ms: float, batches: int = 5) -> None:
        self.clock, self.first_ms, self.ms, self.batches = clock, first_ms, ms, batches

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for k in range(self.batches):
            self.clock.advance(self.first_ms if k == 0 else self.ms)
            yield torch.zeros(4, 3, 8, 8), torch.zeros(4, dtype=torch.int64)


def test_the_first_batch_of_each_epoch_is_reported_apart_from_the_hand_over() -> None:
    clock = FakeClock()
    run = measure(ColdStartLoader(clock, first_ms=50, ms=2), lambda images, labels: clock.advance(10),
                  steps=12, warmup=2, device=CPU, clock=clock)
    # epochs begin at batches 0, 5 and 10; batch 0 is warm-up
    assert run.epoch_start_wait_ms == pytest.approx([50, 50])
    assert run.handover_median_ms == pytest.approx(2) and run.wait_p95_ms == pytest.approx(50)
    steady = measure(ColdStartLoader(clock, first_ms=2, ms=2), lambda images, labels: clock.advance(10),
                     steps=12, warmup=2, device=CPU, clock=clock)
    assert steady.epoch_start_wait_ms == pytest.approx([2, 2])


def test_emulated_step_sleeps_about_its_length() -> None:
    run = measure(DelayedLoader(1), EmulatedStep(20, CPU), steps=6, warmup=1, device=CPU)
    assert run.step_median_ms >= 19  # a sleep never ends early; how late depends on the machine


def test_watch_times_the_loop_body_and_reports_on_demand(capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    watcher = watch(ClockedLoader(clock, 5, batches=10), warmup=1, name="mine", report=True,
                    device=CPU, clock=clock)
    for k, _batch in enumerate(watcher):
        clock.advance(20)
        if k == 5:
            mid = watcher.result()
            assert mid.steps == 5  # warm-up excluded, the current step counted as ending now
    run = watcher.result()
    assert run.steps == 9 and run.loader == "mine"
    assert run.step_median_ms == pytest.approx(20) and run.wait_median_ms == pytest.approx(5)
    assert run.warmup_s == pytest.approx(0.025)
    assert "mine" in capsys.readouterr().out  # the report printed when the loop ended


def test_memory_growth_warning_fires_for_a_leak_only() -> None:
    with pytest.warns(UserWarning, match="grows steadily"):
        leaky = measure(DelayedLoader(15, leak_mb=16), EmulatedStep(5, CPU), steps=24, warmup=2,
                        device=CPU)
    assert leaky.memory_growth and leaky.peak_rss_mb > 300
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clean = measure(DelayedLoader(15), EmulatedStep(5, CPU), steps=24, warmup=2,
                        device=CPU)
    assert not clean.memory_growth


def test_fairness_refuses_runs_that_differ() -> None:
    a = measure(DelayedLoader(1, batch=4), EmulatedStep(0, CPU), steps=3, warmup=1, name="a",
                device=CPU)
    b = measure(DelayedLoader(1, batch=8), EmulatedStep(0, CPU), steps=3, warmup=1, name="b",
                device=CPU)
    assert fairness([a, a], "train").startswith("fair:")
    with pytest.raises(UnfairComparison, match="refusing to compare") as err:
        fairness([a, b], "train")
    assert isinstance(err.value, ValueError) and "batch 8" in str(err.value)


def test_model_step_memory_breakdown_and_accumulation() -> None:
    step = ModelStep(CPU, width=8, blocks=(1, 1), classes=10, accumulate=2)
    images = torch.randn(8, 3, 32, 32)
    labels = torch.randint(0, 10, (8,))
    before = [p.detach().clone() for p in step.model.parameters()]
    step(images, labels)
    after = list(step.model.parameters())
    assert any(not torch.equal(x, y) for x, y in zip(before, after, strict=True)), "the optimizer stepped"
    m = step.memory
    assert m.params_mb > 0 and m.grads_mb == pytest.approx(m.params_mb)
    assert m.optimizer_mb == pytest.approx(m.params_mb)  # SGD momentum: one buffer per param
    assert m.activations_mb > m.params_mb  # 32x32 inputs, a tiny net: activations dominate
    assert m.dominant == "activations" and "checkpointing" in m.summary()
    step(images.to(torch.uint8), labels)  # uint8 NCHW input is accepted too


class _SameTile(torch.utils.data.Dataset[torch.Tensor]):
    """The same tile at every index: any difference between items is the augmentation's."""

    def __init__(self) -> None:
        from tilefeed.bench.peers.loaders import TileTransform

        seeded = torch.Generator().manual_seed(0)
        self.tile = torch.randint(0, 256, (32, 32, 3), dtype=torch.uint8, generator=seeded)
        self.transform = TileTransform(16, train=True)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.transform(self.tile)


def test_tile_transform_gives_each_dataloader_worker_its_own_random_stream() -> None:
    loader = torch.utils.data.DataLoader(_SameTile(), batch_size=1, num_workers=2)
    items = [batch[0] for batch in loader]  # batches alternate between the two workers
    first_of_worker = items[0], items[1]
    assert not torch.equal(*first_of_worker), "both workers drew the same crop and flip"


@pytest.mark.parametrize("step_ms,said", [(0.0, True), (0.5, True), (5.0, False)])
def test_a_step_too_short_for_the_stall_to_mean_anything_is_said(step_ms: float, said: bool) -> None:
    """An empty loop body makes the stall the loader's own pace: ``result()`` warns once and the
    result's note says why; a real step's result has no note."""
    clock = FakeClock()
    w = watch(ClockedLoader(clock, 10, batches=12), device=CPU, clock=clock)
    for _ in w:
        clock.advance(step_ms)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, again = w.result(), w.result()
    assert bool(first.note) is said and again.note == first.note
    assert len([c for c in caught if "too short for the stall" in str(c.message)]) == (1 if said else 0)
    if said:
        assert f"{first.stall_fraction:.0%}" in first.note and "forward and backward" in first.note
