"""Prompt suites: a folder of ``<domain>.jsonl`` files, one prompt a line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from treewise.decoder import TreewiseError

Split = Literal["train", "tune", "test"]


class SuiteError(TreewiseError):
    """A suite folder or line is malformed; the message names the file and line."""


class Prompt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    domain: str
    prompt: str
    split: Split | None = None
    source: str | None = None


def load_suite(directory: str | Path, split: str | None = None, domains: list[str] | None = None) -> list[Prompt]:
    """All prompts of a suite, in file then line order, optionally one split and some domains."""
    directory = Path(directory)
    if not directory.is_dir():
        raise SuiteError(f"suite folder {directory} does not exist: pass --suite DIR (for example data/prompts)")
    if split not in (None, "all", "train", "tune", "test"):
        raise SuiteError(f"unknown split {split!r}: use train, tune, test or all")
    files = sorted(directory.glob("*.jsonl"))
    if not files:
        raise SuiteError(f"suite folder {directory} holds no <domain>.jsonl files")
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for path in files:
        for lineno, line in enumerate(_lines(path), start=1):
            if not line.strip():
                continue
            try:
                prompt = Prompt.model_validate(json.loads(line))
            except (json.JSONDecodeError, ValidationError) as err:
                first = str(err).splitlines()[0] if isinstance(err, json.JSONDecodeError) else _pydantic_msg(err)
                raise SuiteError(f"{path}:{lineno}: malformed prompt line: {first}") from None
            if not prompt.prompt:
                raise SuiteError(f"{path}:{lineno}: empty prompt text")
            if prompt.id in seen:
                raise SuiteError(f"{path}:{lineno}: duplicate prompt id {prompt.id!r}")
            seen.add(prompt.id)
            prompts.append(prompt)
    known = sorted({p.domain for p in prompts})
    if split not in (None, "all"):
        prompts = [p for p in prompts if p.split == split]
    if domains:
        unknown = [d for d in domains if d not in known]
        if unknown:
            raise SuiteError(f"unknown domain {unknown[0]!r}: suite {directory} has {', '.join(known)}; "
                             "pass one of those to --domain")
        prompts = [p for p in prompts if p.domain in domains]
    return prompts


def _lines(path: Path) -> list[str]:
    """The file's lines, split on newlines only (a JSON string may hold U+2028, which ``splitlines`` splits on)."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise SuiteError(f"{path}: cannot read the suite file: {err.strerror or err}") from None
    lines = []
    for lineno, chunk in enumerate(raw.split(b"\n"), start=1):
        try:
            lines.append(chunk.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise SuiteError(f"{path}:{lineno}: not UTF-8 text (byte {err.start} of the line): save the file "
                             "as UTF-8") from None
    return lines


def _pydantic_msg(err: ValidationError) -> str:
    e = err.errors()[0]
    where = ".".join(str(x) for x in e["loc"]) or "line"
    return f"{where}: {e['msg']}"
