"""The storage at a location: an object-store URL (``ObjectStorage``) or a local folder
(``LocalStorage``). Apart from both, so that neither module imports the other at run time."""

from __future__ import annotations

import os
from typing import Any

from tilefeed.store.errors import ConfigError
from tilefeed.store.object_storage import ObjectStorage
from tilefeed.store.storage import LocalStorage, Storage, is_url, local_path


def open_storage(location: str | os.PathLike[str], options: dict[str, Any] | None = None) -> Storage:
    """The storage at ``location``: an object-store URL or a local folder (path or file://).

    Parameters
    ----------
    location : str or os.PathLike
        ``s3://``, ``gs://`` or ``az://`` URL, or a local path (``file://`` too).
    options : dict, optional
        Settings added to the cloud's standard configuration; refused for a local folder.
    """
    if is_url(location):
        return ObjectStorage(str(location), options)
    if options:
        raise ConfigError("storage options apply to object-store URLs, not to the folder "
                          f"{os.fspath(location)!r}")
    return LocalStorage(local_path(location))
