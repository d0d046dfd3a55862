"""What the host gives this process: its usable cores and the memory it can still take."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its affinity), the one count every default uses."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def available_memory() -> int | None:
    """Bytes of memory this process can still take (the kernel's MemAvailable, lowered to what
    a cgroup v2 limit leaves), or None where neither can be read."""
    found: list[int] = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        if limit != "max":
            found.append(max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return min(found) if found else None
