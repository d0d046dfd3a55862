"""``tilefeed doctor``: what this installation can do, on one screen to paste into a bug report.

Reports the PIL build (pillow-simd or plain Pillow, AVX2, every codec and plugin, each checked by a
real round trip where a flag could lie), DALI and whether it sees a GPU, torch and CUDA, zarr and
numcodecs, and the cores. Every problem comes with a one-line fix in the words of the install it
finds: pip commands for a pip install, ``make setup`` in a checkout. A missing PIL, DALI or torch
is a line, never a traceback. A machine without a GPU is information, not a failure; plain Pillow
is a speed note (pillow-simd resizes faster), not a failure; anything tilefeed needs that is
missing or broken is.

``python -m tilefeed.cli.doctor --pil`` checks the PIL part only: ``make setup`` runs it after
installing PIL, so a pillow-simd built without a codec never passes setup silently.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True  # False: shown, never a failure (no GPU, say)


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, ok: bool, detail: str, fix: str = "", required: bool = True) -> None:
        self.checks.append(Check(name, ok, detail, fix, required))

    @property
    def problems(self) -> list[Check]:
        return [c for c in self.checks if c.required and not c.ok]


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _round_trip(fmt: str, **options: Any) -> Callable[[], str]:
    """Write a small picture in ``fmt`` and read it back: proof the codec is really there. What
    the image libraries print to the process's stderr meanwhile (libtiff's ": WEBP compression
    support is not configured.") is kept off the screen and becomes the failure's words."""

    def check() -> str:
        import numpy as np
        from PIL import Image

        pixels = np.linspace(0, 255, 24 * 24 * 3).astype(np.uint8).reshape(24, 24, 3)
        buf = io.BytesIO()
        with _stderr_caught() as said:
            try:
                Image.fromarray(pixels, "RGB").save(buf, fmt, **options)
                buf.seek(0)
                with Image.open(buf) as im:
                    im.load()
                    return f"reads and writes {im.format}"
            except KeyError:  # PIL names no such format: nothing registered it
                raise LookupError(f"no reader or writer for {fmt} is installed") from None
            except Exception as e:
                words = said().strip(" :\n")
                if words:
                    e.add_note(words)  # shown after the error in its line (``_detail``)
                raise

    return check


def _detail(error: BaseException) -> str:
    """An error in one line: its type, its words, then what the library printed (its notes)."""
    notes = getattr(error, "__notes__", [])
    return f"{type(error).__name__}: {error}" + "".join(f" ({note})" for note in notes)


@contextmanager
def _stderr_caught() -> Iterator[Callable[[], str]]:
    """File descriptor 2 sent to a temporary file for the block (C libraries write there, past
    Python's ``sys.stderr``); the function yielded reads what was written."""
    sys.stderr.flush()
    try:
        caught = tempfile.TemporaryFile()
        saved = os.dup(2)
    except OSError:  # no temporary folder, or no fd 2 at all: nothing to keep off the screen
        yield lambda: ""
        return
    with caught:
        os.dup2(caught.fileno(), 2)

        def said() -> str:
            caught.seek(0)
            return caught.read().decode(errors="replace")

        try:
            yield said
        finally:
            os.dup2(saved, 2)
            os.close(saved)


# name -> (how to prove it, what it is for)
PIL_CODECS: dict[str, tuple[Callable[[], str], str]] = {
    "jpeg": (_round_trip("JPEG"), "JPEG (libjpeg-turbo)"),
    "png": (_round_trip("PNG"), "PNG (zlib)"),
    "tiff-deflate": (_round_trip("TIFF", compression="tiff_deflate"), "TIFF, deflate"),
    "tiff-lzw": (_round_trip("TIFF", compression="tiff_lzw"), "TIFF, LZW"),
    "tiff-jpeg": (_round_trip("TIFF", compression="jpeg"), "TIFF, JPEG"),
    "tiff-webp": (_round_trip("TIFF", compression="webp"), "TIFF, WebP"),
    "webp": (_round_trip("WEBP", lossless=True), "WebP"),
    "webp-animated": (_round_trip("WEBP", save_all=True), "animated WebP"),
    "jpeg2000": (_round_trip("JPEG2000"), "JPEG 2000 (openjpeg)"),
    "avif": (_round_trip("AVIF"), "AVIF"),
    "heif": (_round_trip("HEIF"), "HEIC/HEIF"),
}
PLUGIN_CODECS = ("avif", "heif")  # read through plugins (tilefeed[formats]): optional
# what pillow-simd built here has and Pillow's own wheels leave out (libimagequant for its
# licence, WebP inside TIFF): required of a pillow-simd build, a note under plain Pillow
SIMD_ONLY = ("tiff-webp", "libimagequant")


def checkout() -> Path | None:
    """The source checkout this tilefeed runs from (an editable install), or None for a pip install."""
    import tilefeed

    root = Path(tilefeed.__file__).resolve().parents[2]  # src/tilefeed/__init__.py -> the checkout
    return root if (root / "Makefile").is_file() and (root / "pyproject.toml").is_file() else None


@dataclass(frozen=True)
class Fixes:
    """The one-line fixes, in the words of the install found: pip commands, or ``make setup``."""

    from_checkout: bool

    def package(self, name: str) -> str:
        return "run `make setup` again" if self.from_checkout else f"pip install '{name}'"

    @property
    def pil_codecs(self) -> str:
        return ("run `make setup` again (it installs the -dev packages and rebuilds pillow-simd, or keeps "
                "plain Pillow where it cannot)" if self.from_checkout else
                "pip install --force-reinstall pillow (a PIL built from source may lack a library)")

    @property
    def simd(self) -> str:
        return ("`make setup` installs pillow-simd where it can (root or the -dev packages present)"
                if self.from_checkout else
                "optional, for faster resizing: pip uninstall -y pillow && pip install pillow-simd "
                "(needs a compiler and the image libraries' headers)")


def _pil(report: Report, offline: bool, fixes: Fixes) -> None:
    """The PIL build. Plain Pillow is fine (a speed note); a broken pillow-simd, a missing PIL or
    a codec that does not round-trip is a problem. ``offline``: a node installed from a
    wheelhouse, where only the GPU loader runs (it needs no PIL): every PIL gap is a warning."""
    simd_dist = _version("pillow-simd")
    try:
        import PIL
        from PIL import features
    except Exception as e:  # noqa: BLE001 - no PIL at all: one line, then the rest of the report
        fix = (f"pillow-simd {simd_dist} is installed but does not import: pip install --force-reinstall "
               "pillow-simd, or pip uninstall -y pillow-simd && pip install pillow") if simd_dist else \
            fixes.package("pillow")
        report.add("PIL", False, f"cannot import: {type(e).__name__}: {e}", fix, required=not offline)
        return
    simd = "post" in PIL.__version__  # pillow-simd's versions are upstream's plus .postN
    if simd_dist and not simd:
        report.add("PIL", False, f"{PIL.__version__}: plain Pillow shadows pillow-simd {simd_dist} (both "
                   "provide PIL; the one installed last wins)",
                   "pip uninstall -y pillow pillow-simd && " + (
                       "run `make setup` again" if fixes.from_checkout else "pip install pillow-simd"),
                   required=not offline)
    else:
        report.add("PIL", True, f"{PIL.__version__} ({'pillow-simd' if simd else 'plain Pillow'})")
    if not simd:
        report.add("pillow-simd", False, "not installed: resizing runs at plain Pillow's speed", fixes.simd,
                   required=False)
    avx2 = _cpu_has("avx2")
    report.add("AVX2", avx2, "the CPU has AVX2" if avx2 else "this CPU has no AVX2 (slower resize)",
               required=False)
    plugins: dict[str, bool] = {}  # codec -> a plugin registered it
    modules: dict[str, str] = {}  # codec -> the plugin's module
    try:
        from tilefeed.preprocess.plugins import PLUGINS, register_plugins

        plugins, modules = register_plugins(), dict(PLUGINS)
    except Exception as e:  # noqa: BLE001 - the plugins' own lines below say what is missing
        report.add("plugins", False, f"cannot register: {type(e).__name__}: {e}", required=False)
    for name, (prove, what) in PIL_CODECS.items():
        optional = name in PLUGIN_CODECS or (name in SIMD_ONLY and not simd)
        if name in PLUGIN_CODECS:  # credited to whoever reads it: the plugin, or PIL itself
            what += f" ({modules.get(name, name).replace('_', '-')} plugin)" if plugins.get(name) else " (PIL)"
        try:
            report.add(f"codec {name}", True, f"{what}: {prove()}")
        except Exception as e:  # noqa: BLE001 - any failure means the codec is not usable
            fix = fixes.package("tilefeed[formats]") if optional else fixes.pil_codecs
            report.add(f"codec {name}", False, f"{what}: {_detail(e)}", fix,
                       required=not offline and not optional)
    for feature in ("littlecms2", "libimagequant"):
        try:
            ok, detail = bool(features.check(feature)), ""
        except Exception as e:  # noqa: BLE001 - a PIL whose extension fails to load: a line
            ok, detail = False, f": {type(e).__name__}: {e}"
        required = not offline and not (feature in SIMD_ONLY and not simd)
        report.add(feature, ok, ("available" if ok else "missing") + detail, fixes.pil_codecs,
                   required=required)


def _cpu_has(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(flag in line.split() for line in f if line.startswith("flags"))
    except OSError:
        return False


def _dali_distribution() -> tuple[str, str] | None:
    for dist in ("nvidia-dali-cuda130", "nvidia-dali-cuda120", "nvidia-dali-cuda110"):
        version = _version(dist)
        if version:
            return dist, version
    return None


def _stack(report: Report, fixes: Fixes) -> None:
    from tilefeed.pipeline.device import dali_extra

    try:
        import torch

        cuda = torch.version.cuda
        report.add("torch", True, f"{torch.__version__}, " + (f"CUDA {cuda}" if cuda else "CPU build")
                   + f": DALI's extra is tilefeed[{dali_extra(cuda)}]")
    except Exception as e:  # noqa: BLE001
        report.add("torch", False, f"cannot import: {type(e).__name__}: {e}",
                   "pip install torch (the build for your CUDA: see pytorch.org's selector)")
    else:
        _gpus(report, torch)
    dali = _dali_distribution()
    torch_cuda = _torch_cuda_major()
    extra = dali_extra(None if torch_cuda is None else str(torch_cuda))
    if dali is not None and torch_cuda is not None:
        dali_cuda = int(dali[0].removeprefix("nvidia-dali-cuda")[:-1])
        report.add("CUDA match", dali_cuda == torch_cuda,
                   f"torch CUDA {torch_cuda}, DALI built for CUDA {dali_cuda}",
                   f"pip uninstall {dali[0]} && pip install 'tilefeed[{extra}]'")
    if dali is None:
        report.add("DALI", False, "not installed (the Loader needs it; TileDataset and preprocess do not)",
                   f"make setup CUDA={extra.removeprefix('cuda')}" if fixes.from_checkout else
                   f"pip install 'tilefeed[{extra}]' (the extra of your torch's CUDA)")
    else:
        try:
            import nvidia.dali  # noqa: F401

            report.add("DALI", True, f"{dali[0]} {dali[1]}")
        except Exception as e:  # noqa: BLE001
            report.add("DALI", False, f"{dali[0]} {dali[1]} does not import: {type(e).__name__}: {e}",
                       f"pip install --force-reinstall {dali[0]}")
    for dist in ("zarr", "numcodecs", "crc32c"):
        version = _version(dist)
        report.add(dist, version is not None, version or "not installed", fixes.package(dist))
    try:
        from tilefeed.store.host import usable_cores

        report.add("cores", True, f"{usable_cores()} usable by this process", required=False)
    except Exception as e:  # noqa: BLE001 - a report, not a crash
        report.add("cores", False, f"cannot count: {type(e).__name__}: {e}", required=False)


def _gpus(report: Report, torch: Any) -> None:
    """The GPUs torch sees: information (none is no failure), and a driver that fails a line."""
    try:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(gpus))
    except Exception as e:  # noqa: BLE001 - a broken driver: said, never a traceback
        report.add("GPU", False, f"the CUDA driver fails: {type(e).__name__}: {e}", required=False)
        return
    report.add("GPU", gpus > 0, f"{gpus} visible: {names}" if gpus else "none visible (CPU only)",
               required=False)
    _graph_shape(report, gpus)


def _graph_shape(report: Report, gpus: int) -> None:
    """Which graph CPU Loaders build: ``TILEFEED_DEVICE_GRAPH=1`` gives them the GPU's (slower
    than the reader threads' resize: a way to test, not to train), said whenever it is set."""
    from tilefeed.pipeline.device import DEVICE_GRAPH_ENV, device_graph

    try:
        on = device_graph()
    except Exception as e:  # noqa: BLE001 - a bad value: said, never a traceback
        report.add("graph", False, str(e), fix=f"unset {DEVICE_GRAPH_ENV} or set it to 1 or 0")
        return
    if on:
        where = "CPU Loaders" if gpus else "every Loader here (no GPU)"
        report.add("graph", True, f"{DEVICE_GRAPH_ENV}=1: {where} build the GPU's graph on DALI's CPU backend "
                   "(for testing it; slower than the default)", required=False)


def _torch_cuda_major() -> int | None:
    """CUDA major version of the installed torch; None for a CPU build (never a mismatch)."""
    try:
        import torch

        return int(torch.version.cuda.split(".")[0]) if torch.version.cuda else None
    except Exception:  # noqa: BLE001 - reported by the torch line
        return None


def diagnose(pil_only: bool = False, offline: bool = False) -> Report:
    """Every check; ``pil_only``: the PIL build's alone; ``offline``: PIL gaps are warnings."""
    report = Report()
    fixes = Fixes(from_checkout=checkout() is not None)
    _pil(report, offline, fixes)
    if not pil_only:
        _stack(report, fixes)
    return report


def format_report(report: Report) -> str:
    width = max(len(c.name) for c in report.checks)
    lines = []
    for c in report.checks:
        mark = "ok" if c.ok else ("!!" if c.required else "--")
        lines.append(f"{mark}  {c.name:<{width}}  {c.detail}")
    problems = report.problems
    if problems:
        lines.append("")
        lines.append(f"{len(problems)} problem(s):")
        lines += [f"  {c.name}: {c.fix}" for c in problems]
    else:
        lines.append("\nno problems")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``tilefeed doctor`` (and of ``python -m tilefeed.cli.doctor``)."""
    from tilefeed.cli.arguments import HelpFormatter

    parser = argparse.ArgumentParser(prog="tilefeed doctor", description=(__doc__ or "").split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--pil", action="store_true", help="check the PIL build only")
    parser.add_argument("--json", action="store_true",
                        help="print the report as JSON on stdout instead of text")
    parser.add_argument("--offline", action="store_true",
                        help="a node installed from a wheelhouse: PIL gaps are warnings")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    report = diagnose(pil_only=args.pil, offline=args.offline)
    if args.json:
        print(json.dumps({"checks": [asdict(c) for c in report.checks],
                          "problems": len(report.problems)}, indent=2))
    else:
        print(format_report(report))
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
