"""Feed a tilefeed store to training: a DALI ``Loader`` and a torch ``TileDataset``."""

from pipeline.dataset import TileDataset
from pipeline.loader import Loader
from pipeline.reader import StoreReader
from preprocess.errors import ConfigError, CorruptChunkError, StoreFormatError

__all__ = ["ConfigError", "CorruptChunkError", "Loader", "StoreFormatError", "StoreReader", "TileDataset"]
