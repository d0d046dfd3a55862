"""``tilefeed info`` and ``tilefeed verify``: a store's figures, and every file of it checked
(the checks themselves are ``store.inspection``'s)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from tilefeed.cli.storage_options import shown, storage_options
from tilefeed.store.inspection import printable

if TYPE_CHECKING:
    from tilefeed.store.inspection import StoreInfo


def info_command(args: argparse.Namespace) -> int:
    """``tilefeed info STORE``: the store's figures as text, or as JSON with ``--json``."""
    from tilefeed.store.inspection import info
    from tilefeed.store.storage import redact

    options = storage_options(args)
    d = info(args.store, options)
    print(redact(json.dumps(d.as_dict(), indent=2) if args.json else format_info(d), options))
    return 0


def verify_command(args: argparse.Namespace) -> int:
    """``tilefeed verify STORE``: 0 when sound; otherwise each problem on a line, and 1."""
    from tqdm import tqdm

    from tilefeed.store.inspection import verify

    checked = [0]  # counted here: a disabled bar counts nothing

    def one_more() -> None:
        checked[0] += 1
        bar.update(1)

    with tqdm(unit="shard", disable=args.quiet or not sys.stderr.isatty(), file=sys.stderr) as bar:
        problems = verify(args.store, deep=args.deep, on_shard=one_more, storage_options=storage_options(args))
    shards = checked[0]
    for line in problems:
        print(shown(line, args))
    what = "decoded and checked" if args.deep else "checked"
    if problems:
        print(f"tilefeed: error: {len(problems)} problems in {shown(args.store, args)}", file=sys.stderr)
        return 1
    print(f"{shown(args.store, args)}: sound ({shards} shards {what})")
    return 0


def format_info(d: StoreInfo, max_rejects: int = 20) -> str:
    """The text form of ``info``; names and paths escaped (JSON output keeps them as they are)."""
    made = ", ".join(f"{k}={v}" for k, v in d.made.items())
    classes = [printable(c) for c in d.classes]
    shown = ", ".join(classes[:8]) + (f", ... ({len(classes)} in all)" if len(classes) > 8 else "")
    lines = [
        f"store      {printable(d.path)}  ({d.format})",
        f"samples    {d.samples} tiles from {d.accepted} of {d.sources} sources ({d.rejected} rejected)",
        f"tile       {'x'.join(map(str, d.tile))} uint8, codec {d.codec}"
        + (f" q{d.quality}" if d.quality else ""),
        f"shards     {d.shards} x {d.shard_size} tiles, {d.bytes / 2**20:.1f} MiB on disk",
        f"classes    {len(classes)}: {shown}",
        f"made with  {made}",
    ]
    if d.targets is not None:
        t = d.targets
        kinds = ", ".join([*(["boxes"] if t["boxes"] else []),
                           *([f"{t['masks']} masks"] if t["masks"] else [])])
        names = [printable(c["name"]) for c in t["categories"]]
        listed = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
        lines.insert(5, f"targets    {kinds}: {t['objects']} objects, {len(names)} categories"
                     + (f" ({listed})" if names else ""))
    if d.texts or d.fields:
        fields = ", ".join(f"{printable(f['name'])} ({f['dtype']})" for f in d.fields) or "none"
        lines.insert(5, f"texts      {', '.join(map(printable, d.texts)) or 'none'}; fields {fields}"
                     + ("" if d.labelled else "; no class labels"))
    for r in d.rejects[:max_rejects]:
        lines.append(f"rejected   {printable(r['path'])}: {printable(r['reason'])}")
    if d.rejected > len(d.rejects):  # the attributes list the first; the store's arrays hold all
        lines.append(f"rejected   ... and {d.rejected - min(len(d.rejects), max_rejects)} more (--json lists "
                     f"{len(d.rejects)}; the arrays reject_paths and reject_reasons hold all {d.rejected})")
    elif len(d.rejects) > max_rejects:
        lines.append(f"rejected   ... and {len(d.rejects) - max_rejects} more (see --json)")
    return "\n".join(lines)
