"""Every wheel tilefeed needs on an offline node, downloaded here, with a manifest.

    python tools/wheelhouse.py [--python 3.12] [--cuda 13] [--out wheelhouse]

Downloads, for the target Python and platform (manylinux x86_64), tilefeed's own wheel, its
dependencies without torch (the node has its own CUDA build), DALI for the CUDA major version
with the nvImageCodec / nvCOMP / nvJPEG wheels it requires, pycocotools (the ``coco`` extra),
the AVIF and HEIC plugins, plain
pillow (the fallback PIL where pillow-simd cannot be compiled) and the pillow-simd source. Writes
``MANIFEST.json``: file, name, version and sha256 of each. Install it on the node with

    python -m pip install --no-index --find-links wheelhouse 'tilefeed[cuda13,coco]' \\
        pillow-avif-plugin pillow-heif pillow
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64")
EXTRAS = ("pillow-avif-plugin==1.6.0", "pillow-heif==1.8.1", "pillow")
SIMD = "pillow-simd==12.1.1.post0"


def requirements(cuda: int) -> list[str]:
    """tilefeed's dependencies for a node, torch left out."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = [d for d in project["dependencies"] if not re.match(r"torch\b", d)]
    # the coco extra too: a GPU node's detection bench and --instance-masks need pycocotools
    return deps + project["optional-dependencies"][f"cuda{cuda}"] + project["optional-dependencies"]["coco"] \
        + list(EXTRAS)


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True)


def build(out: Path, python: str, cuda: int) -> list[dict[str, str]]:
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(ROOT / "build", ignore_errors=True)  # setuptools would pack a stale build/lib too
    pip("wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(out), str(ROOT))
    target = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp",
              "--abi", f"cp{python.replace('.', '')}"]
    for platform in PLATFORMS:
        target += ["--platform", platform]
    pip("download", "--quiet", "-d", str(out), *target, *requirements(cuda))
    pip("download", "--quiet", "--no-deps", "--no-binary=:all:", "-d", str(out), SIMD)
    entries = []
    for path in sorted(out.iterdir()):
        if path.suffix in (".whl", ".gz"):
            name, version = path.name.split("-")[:2]
            entries.append({"file": path.name, "name": name, "version": version.removesuffix(".tar.gz"),
                            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    (out / "MANIFEST.json").write_text(json.dumps(
        {"python": python, "cuda": cuda, "platforms": list(PLATFORMS), "files": entries}, indent=2))
    return entries


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="3.12", help="target Python version (the node's)")
    parser.add_argument("--cuda", type=int, choices=(12, 13), default=13, help="CUDA major version")
    parser.add_argument("--out", type=Path, default=ROOT / "wheelhouse", help="folder to fill")
    args = parser.parse_args()
    entries = build(args.out, args.python, args.cuda)
    size = sum((args.out / e["file"]).stat().st_size for e in entries)
    print(f"{args.out}: {len(entries)} files, {size / 2**20:.0f} MiB, manifest MANIFEST.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
