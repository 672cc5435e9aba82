"""The ``treewise`` command, assembled in one place: each job registers its own sub-commands."""

from __future__ import annotations

import typer

from studies.acceptance import cli as acceptance_cli
from studies.bench import cli as bench_cli
from studies.collect import cli as collect_cli
from studies.learn import cli as learn_cli
from studies.pair import cli as pair_cli
from studies.tune import cli as tune_cli

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Domain-aware tree speculative decoding.")

_JOBS = (
    bench_cli,  # bench, decode, latency
    pair_cli,  # demo, train-pair, pair-report
    collect_cli,  # collect
    acceptance_cli,  # study acceptance
    learn_cli,  # train, evaluate, train-domains
    tune_cli,  # tune, report
)
for _job in _JOBS:
    _job.register(app)


def main() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight-loading bars would interleave with rich output
    app()
