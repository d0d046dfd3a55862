"""The progress bar the command line shows while preprocessing (presentation only)."""

from __future__ import annotations

import sys
from collections.abc import Callable


def progress_bar(enabled: bool) -> Callable[[int], Callable[[int, int], None]]:
    """A tqdm bar over sources, with rate, ETA and the running reject count."""

    def start(total: int) -> Callable[[int, int], None]:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="img", disable=not enabled, file=sys.stderr,
                   dynamic_ncols=True, smoothing=0.1)
        rejected = 0

        def tick(done: int, rejects: int) -> None:
            nonlocal rejected
            rejected += rejects
            if rejects:
                bar.set_postfix(rejected=rejected, refresh=False)
            bar.update(done)
            if bar.n >= total:
                bar.close()

        return tick

    return start
