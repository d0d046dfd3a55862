"""Where the writer's tasks run, and how the tasks of a worker that died run again.

The pool is a local pool of worker processes, or the workers of a Dask cluster (``distributed``,
an optional dependency, imported only when a scheduler address is given). Tasks are idempotent
(every file appears whole or not at all), so a task lost with its worker is simply sent again;
a part's task is sent again decoding image by image, so that an image that kills its decoder
is the only one lost.
"""

from __future__ import annotations

import gc
import os
import multiprocessing
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from typing import Any, Literal

from tilefeed.store.object_storage import client_started


@dataclass(frozen=True)
class Task:
    """A submitted part or shard task, kept so that it can run again if its worker dies. The
    last argument of a part's task is whether it decodes each image in a process of its own."""

    kind: Literal["part", "shards"]  # a part (with the shards ready when it was sent), or shards alone
    number: int  # the part, or the first shard
    fn: Callable[..., Any]
    args: tuple[Any, ...]

    def after_a_death(self) -> Task:
        """This task to send again after its worker died: a part, image by image."""
        if self.kind != "part":
            return self
        if self.args[-1]:  # already isolated: the worker died of something other than one image
            raise BrokenProcessPool("a worker process died while decoding images one by one")
        return replace(self, args=(*self.args[:-1], True))


class _ClientExecutor:
    """A Dask cluster as the pool: its concurrent.futures view, closed with the run."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.executor = client.get_executor(pure=False)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        return self.executor.submit(fn, *args)  # type: ignore[no-any-return]

    def __enter__(self) -> _ClientExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.executor.shutdown(wait=exc[0] is None)
        self.client.close()


class Pool:
    """Where tasks run: a local pool of worker processes (made anew when one died), or the
    workers of a Dask cluster."""

    def __init__(self, workers: int, scheduler: str | None) -> None:
        self.workers, self.scheduler = workers, scheduler
        self.executor = self._start()

    @property
    def on_this_machine(self) -> bool:
        """Whether the workers are processes of this machine (not a cluster's)."""
        return self.scheduler is None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        return self.executor.submit(fn, *args)

    def worker_died(self, fut: Future[Any]) -> bool:
        """The task failed because its process died (a local pool's, or a Dask worker killed
        repeatedly)."""
        e = fut.exception()
        if isinstance(e, BrokenProcessPool):
            return True
        if self.scheduler is None or e is None:
            return False
        from distributed import KilledWorker

        return isinstance(e, KilledWorker)

    def restart(self) -> None:
        """After a worker died: a local pool is broken for good, so a new one; a cluster
        replaces its workers itself."""
        if self.scheduler is None:
            self.executor.__exit__(None, None, None)
            self.executor = self._start()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.executor.__exit__(*exc)

    def _start(self) -> ProcessPoolExecutor | _ClientExecutor:
        if self.scheduler is not None:
            from distributed import Client

            # Tasks are idempotent (temporary name, then rename), so a task whose worker died
            # is simply run again elsewhere.
            return _ClientExecutor(Client(self.scheduler))
        # Worker processes even for one worker: a decoder that crashes takes down a worker,
        # never the run. fork where there is one: workers start with the modules already
        # imported (spawn costs about 0.4 s per run here). They only decode images and write
        # files, so nothing of the driver's other threads (zarr's event loop, tqdm's monitor)
        # is touched in a child.
        # A bucket's client (obstore) does not survive fork(): forkserver children never ran it.
        methods = multiprocessing.get_all_start_methods()
        method = "fork" if not client_started() and "fork" in methods else (
            "forkserver" if "forkserver" in methods else "spawn")
        context = multiprocessing.get_context(method)
        if method == "forkserver":
            context.set_forkserver_preload(["tilefeed.preprocess.tasks"])
        return ProcessPoolExecutor(self.workers, mp_context=context, initializer=_start_worker,
                                   initargs=(dict(os.environ),))


def _start_worker(environment: dict[str, str]) -> None:
    """A worker's first step: the driver's environment as it is at the pool's start (a
    forkserver, started by an earlier run, forks workers with the environment of its own start,
    while a bucket's endpoint or credentials may have changed since); then the objects it was
    forked with frozen. A forked worker starts with the driver's objects, garbage included;
    frozen, they are never collected there, so no finalizer of the driver's (a DALI pipeline's,
    which waits for threads a child does not have) ever runs in a worker."""
    os.environ.clear()
    os.environ.update(environment)
    gc.freeze()


class InFlight:
    """The tasks sent and not yet taken back, each with its task so that it can run again."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.pending: dict[Future[Any], Task] = {}

    def __bool__(self) -> bool:
        return bool(self.pending)

    def send(self, task: Task, executor: Executor | None = None) -> None:
        """Run ``task`` on the pool, or on ``executor`` (a thread of the driver's)."""
        runner = executor if executor is not None else self.pool
        self.pending[runner.submit(task.fn, *task.args)] = task

    def parts(self) -> int:
        """How many part tasks are in flight."""
        return sum(task.kind == "part" for task in self.pending.values())

    def collect(self) -> tuple[list[tuple[Task, Future[Any]]], list[Task]]:
        """Wait for tasks to finish: those done (their results, or the errors they raise, in
        their futures), and those lost with a dead worker."""
        finished, _ = wait(self.pending, return_when=FIRST_COMPLETED)
        if any(self.pool.worker_died(f) for f in finished):
            # Every task in flight on a dead worker pool is lost: wait for the pool to fail
            # them all, then run them again on a new pool.
            finished, _ = wait(self.pending)
        lost = [self.pending.pop(f) for f in finished if self.pool.worker_died(f)]
        done = [(self.pending.pop(f), f) for f in finished if f in self.pending]
        return done, lost

    def send_again(self, lost: list[Task]) -> None:
        """The tasks lost with a dead worker, on a new pool (parts image by image)."""
        self.pool.restart()
        for task in lost:
            self.send(task.after_a_death())
