"""Where the shipped data lives (re-exported from the decoder, the lowest layer that needs it)."""

from decoder.paths import data_dir, default_pair

__all__ = ["data_dir", "default_pair"]
