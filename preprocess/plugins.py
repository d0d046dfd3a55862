"""Image formats beyond what PIL compiles in: AVIF and HEIC/HEIF through maintained plugin wheels.

pillow-simd builds AVIF only against libavif >= 1.0, which many distributions do not ship, so
``pillow-avif-plugin`` (libavif bundled) reads it; ``pillow-heif`` reads phone photos (HEIC).
Both register themselves with PIL; a missing one is reported by ``tilefeed doctor``.
"""

from __future__ import annotations

import importlib
from typing import Final

PLUGINS: Final = {"avif": "pillow_avif", "heif": "pillow_heif"}
_registered: dict[str, bool] = {}


def register_plugins() -> dict[str, bool]:
    """Register every installed plugin with PIL, once; returns which ones are available."""
    if _registered:
        return _registered
    for name, module in PLUGINS.items():
        try:
            mod = importlib.import_module(module)
            if name == "heif":
                mod.register_heif_opener()
            _registered[name] = True
        except Exception:  # noqa: BLE001 - a broken plugin must not stop preprocessing; doctor says why
            _registered[name] = False
    return _registered
