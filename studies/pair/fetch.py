"""Moved to ``treewise.studies.shared.fetch``: every job that loads the real pair may fetch its target, and jobs
import only ``studies.shared``. These names stay importable from here for the pair's own commands."""

from treewise.studies.shared.fetch import (  # noqa: F401
    MARKER,
    SOURCES,
    FetchError,
    WheelModel,
    cache_root,
    converted_dir,
    fetch,
    is_converted,
)
