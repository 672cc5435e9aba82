"""The ``treewise`` command, assembled in one place: each job registers its own sub-commands.

Building the command imports no torch, transformers, optuna, LightGBM, matplotlib or pyarrow, nor the
decoder, predictor or controller (all of which import torch): each command imports what it runs, so
``treewise --help`` and ``treewise CMD --help`` answer in well under two seconds. tests/studies/test_cli.py
holds this.
"""

from __future__ import annotations

import os

import typer

from .acceptance import cli as acceptance_cli
from .bench import cli as bench_cli
from .bench import host_cli, profile_cli
from .collect import cli as collect_cli
from .learn import cli as learn_cli
from .pair import cli as pair_cli
from .tune import cli as tune_cli

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Domain-aware tree speculative decoding.")

_JOBS = (
    bench_cli,  # bench, decode, latency
    host_cli,  # host
    profile_cli,  # profile, forest-bench
    pair_cli,  # demo, train-pair, pair-report
    collect_cli,  # collect
    acceptance_cli,  # study acceptance
    learn_cli,  # train, evaluate, train-domains
    tune_cli,  # tune, report
)
for _job in _JOBS:
    _job.register(app)


def main() -> None:
    # Weight-loading bars would interleave with rich output. Set before transformers is imported (it reads
    # this at import), and only as a default: a user's own setting wins.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    app()
