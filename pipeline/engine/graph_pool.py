"""Built DALI graphs, kept for reuse by the next Loader with the same settings.

Building, running and dropping a DALI pipeline leaves native memory behind (measured here at
30-70 KB per pipeline on the CPU, steadily, while Python objects, threads and files stay flat),
so a process that creates a Loader per epoch, per evaluation or per trial grows until it dies.
A graph is therefore never dropped while it can serve again: its feed stops (what it prepared
for a stream nobody will take is recognised by its tag and dropped when it comes out) and the
graph goes back to a small pool keyed by everything that shapes it. The output size is not
among them: it reaches the graph per sample (``pipeline.planning.sizes``), so one graph serves every size
a progressive-resizing schedule asks for. A few idle graphs (``MAX_IDLE``) bound the
threads and memory the pool holds.

What a graph is and how one is built: ``engine.graph``.
"""

from __future__ import annotations

import atexit
import threading
from collections import deque
from collections.abc import Hashable

from tilefeed.pipeline.engine.augment import Augment
from tilefeed.pipeline.engine.graph import Graph, GraphSettings, build
from tilefeed.pipeline.reading.protocol import Reader

MAX_IDLE = 4
_idle: dict[Hashable, list[Graph]] = {}
_lock = threading.Lock()
# Graphs of Loaders finalised by the garbage collector, given back on the next call here. A
# finaliser runs wherever a collection starts, possibly inside ``threading`` holding its own
# locks or in a thread holding a feed's: stopping threads there (joining them) can deadlock.
_orphans: deque[tuple[Hashable, Graph]] = deque()


def key(reader: Reader, augment: Augment, settings: GraphSettings, direct: bool = False) -> Hashable:
    return (augment, reader.codec.shape, reader.is_image_coded, settings, direct)


def orphan(graph_key: Hashable, graph: Graph) -> None:
    """``give`` for a finaliser: only noted here (a deque's append takes no lock), given back
    by the next ``take``, ``give`` or ``clear``."""
    _orphans.append((graph_key, graph))


def _adopt() -> None:
    while _orphans:
        try:
            graph_key, graph = _orphans.popleft()
        except IndexError:  # another thread took the last one
            return
        give(graph_key, graph)


def take(reader: Reader, augment: Augment, settings: GraphSettings, direct: bool = False) -> Graph:
    """An idle graph with these settings, or a new one (``graph.build``). ``direct``: the output
    is the stored tiles at their size, always (no DALI pipeline; on the CPU only)."""
    _adopt()
    with _lock:
        idle = _idle.get(key(reader, augment, settings, direct))
        while idle:
            graph = idle.pop()
            if graph.alive:
                return graph
    return build(reader, augment, settings, direct)


def give(graph_key: Hashable, graph: Graph) -> None:
    """Return a graph after use: kept when its feed stopped cleanly and the pool has room, else
    closed.

    A kept graph ends its reader threads (``restart()`` makes new ones) and forgets the store;
    only DALI's own worker threads stay parked with it."""
    _adopt()
    if graph.alive and graph.park():
        graph.source.close()
        graph.source.reader = None  # type: ignore[assignment]  # the store is the Loader's, not the pool's
        with _lock:
            if sum(len(v) for v in _idle.values()) < MAX_IDLE:
                _idle.setdefault(graph_key, []).append(graph)
                return
    graph.close()


def clear() -> None:
    """Close every idle graph (their threads go with them)."""
    _adopt()
    with _lock:
        graphs = [g for v in _idle.values() for g in v]
        _idle.clear()
    for g in graphs:
        g.close()


# Idle graphs are closed before the interpreter tears down: a pipeline left to DALI's own
# shutdown can abort there on a GPU (DALI#6166).
atexit.register(clear)
