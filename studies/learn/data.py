"""What the learners read from the studies' folders: node logs of collected runs, a suite's prompts."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from treewise.controller.domains import DomainClassifierConfig, DomainTraining, train_domain_classifier
from treewise.decoder.records.nodelog import NodeLogError, read_node_logs
from treewise.studies.shared.runs import RunError, load_run
from treewise.studies.shared.suites import load_suite


def read_runs(paths: list[Path]) -> pa.Table:
    """Node logs of one or more folders. A collect run (``manifest.json``) gives the parts of its finished
    prompts only (as the acceptance study reads it): a part whose prompt has no record yet, from a collect
    still running or killed before its resume, is not read as complete. Any other folder gives every
    parquet file under ``DIR/nodes`` when present, else under ``DIR``."""
    tables = [_read_one(Path(p)) for p in paths]
    return pa.concat_tables(tables)


def _read_one(path: Path) -> pa.Table:
    if (path / "manifest.json").is_file():
        try:
            return load_run(path).nodes
        except RunError as err:  # the learners' commands report node-log errors in one line
            raise NodeLogError(str(err)) from None
    return read_node_logs(path / "nodes" if (path / "nodes").is_dir() else path)


def train_on_suite(suite: Path, config: DomainClassifierConfig | None = None) -> DomainTraining:
    """Fit on the suite's train split, report on its test split (the controller cannot read suites itself)."""
    return train_domain_classifier(load_suite(suite, "train"), load_suite(suite, "test"), config)
