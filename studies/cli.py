"""The ``treewise`` command: each stage's module registers its own sub-commands here."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Domain-aware tree speculative decoding.")

# Modules that define `register(app)`; missing ones are skipped so stages can land one at a time.
_COMMAND_MODULES = (
    "studies.bench_cli",  # bench, decode
    "studies.pair_cli",  # demo, train-pair
    "studies.acceptance_cli",  # collect, study
    "studies.predictor_cli",  # train, evaluate
    "studies.controller_cli",  # train-domains
    "studies.tune_cli",  # tune, report
)


def _register() -> None:
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name == name:
                continue
            raise
        module.register(app)


def main() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight-loading bars would interleave with rich output
    _register()
    app()
