"""Run a ``tilefeed bench`` command and keep its JSON with where and how it was made.

    python tools/bench_record.py -- tilefeed bench FORM ... --out docs/data/NAME.json
    python tools/bench_record.py --repeat 3 -- tilefeed bench ... --out docs/data/NAME.json

The command writes ``--out FILE`` (every bench form takes it); this adds ``provenance`` to that
JSON: the command as given, the commit (``-dirty`` when tracked files differ from it), the date,
the machine (CPU model, cores, memory, Python, torch, DALI and PIL versions, GPU) and the load
average just before and just after the run, since the figures of a shared machine move with
what else ran. ``--repeat N`` runs the command N times back to back and keeps every run's JSON,
in order, under ``repeats`` (the tables that show several runs of one command). The pages'
tables are drawn from these files by ``tools/render_benchmarks.py``. Run it with the
repository's ``src`` on PYTHONPATH or tilefeed installed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)
    return done.stdout.strip()


def commit() -> str:
    """The tree's commit, '-dirty' added when tracked files differ from it."""
    head = _git("rev-parse", "HEAD") or "unknown"
    return head + ("-dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the system has none)."""
    return [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None


def machine() -> dict[str, Any]:
    """The facts a bench's figures depend on: CPU model and cores, memory, GPU, versions."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    memory = None
    try:
        memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    load = load_average()
    from tilefeed.store.host import usable_cores

    facts: dict[str, Any] = {"host": platform.node(), "cpu": cpu, "cores": usable_cores(), "memory_gib": memory,
                             "load_average_1m": load[0] if load else None, "os": platform.platform(),
                             "python": platform.python_version()}
    for name, module in (("torch", "torch"), ("dali", "nvidia.dali"), ("pil", "PIL")):
        try:
            facts[name] = __import__(module, fromlist=["__version__"]).__version__
        except ImportError:
            facts[name] = None
    try:
        import torch

        facts["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        facts["gpu"] = None
    return facts


def json_path(command: list[str]) -> Path:
    """Where ``command`` writes its JSON: its ``--out`` option's value (``--json PATH``, the
    spelling before, too)."""
    for k, word in enumerate(command):
        for option in ("--out", "--json"):
            if word == option and k + 1 < len(command):
                return Path(command[k + 1])
            if word.startswith(f"{option}="):
                return Path(word.split("=", 1)[1])
    raise SystemExit("record: the command names no --out FILE to stamp")


def _run(command: list[str], path: Path) -> dict[str, Any]:
    argv = [sys.executable, "-m", "tilefeed", *command[1:]] if command[0] == "tilefeed" else command
    path.unlink(missing_ok=True)  # a failed run must not leave an older run's JSON to be stamped
    done = subprocess.run(argv, check=False)
    if done.returncode != 0 and not path.exists():
        raise SystemExit(f"record: the command failed (exit {done.returncode}); nothing stamped")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def record(command: list[str], repeat: int = 1) -> Path:
    """Run ``command`` ``repeat`` times (``tilefeed ...`` runs with this Python) and stamp its
    JSON with its provenance. A form that exits 1 with its JSON written (soak's failed verdict)
    is kept: the verdict is a figure too."""
    if not command:
        raise SystemExit("record: give the command after --")
    if repeat < 1:
        raise SystemExit("record: --repeat takes 1 or more")
    path = json_path(command)
    # the tree as the command found it: its own --out may be a tracked file it then rewrites
    tree = commit()
    began = datetime.datetime.now(datetime.UTC)
    facts = machine()  # before the command: its load average is the other tenants'
    before = load_average()
    runs = [_run(command, path) for _ in range(repeat)]
    data: dict[str, Any] = runs[0] if repeat == 1 else {"repeats": runs}
    data["provenance"] = {"command": " ".join(command), "commit": tree,
                          "date": began.isoformat(timespec="seconds"), "machine": facts,
                          "load_before": before, "load_after": load_average(), "repeat": repeat}
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"stamped: {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    split = args.index("--") if "--" in args else len(args)
    parser = argparse.ArgumentParser(prog="tools/bench_record.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=1, help="runs of the command, back to back")
    parsed = parser.parse_args(args[:split])
    record(args[split + 1:], parsed.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
