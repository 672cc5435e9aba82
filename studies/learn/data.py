"""What the learners read from the studies' folders: node logs of collected runs, a suite's prompts."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from controller.domains import DomainClassifierConfig, DomainTraining, train_domain_classifier
from decoder.nodelog import read_node_logs
from studies.shared.suites import load_suite


def read_runs(paths: list[Path]) -> pa.Table:
    """Node logs of one or more run folders: ``RUN/nodes`` when present (collect also writes other
    parquet files under RUN), else every parquet file under the path."""
    tables = [read_node_logs(p / "nodes" if (p / "nodes").is_dir() else p) for p in paths]
    return pa.concat_tables(tables)


def train_on_suite(suite: Path, config: DomainClassifierConfig | None = None) -> DomainTraining:
    """Fit on the suite's train split, report on its test split (the controller cannot read suites itself)."""
    return train_domain_classifier(load_suite(suite, "train"), load_suite(suite, "test"), config)
