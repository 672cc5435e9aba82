"""``domain="auto"``: pick a prompt's domain with a small multinomial naive Bayes text classifier.

Features are hashed character n-grams (1-4 by default) plus word unigrams, counted into a fixed number of
buckets, so the model is one ``classes x buckets`` table and predicting is a gather and a dot product.

A wrong guess only costs speed, never correctness: the domain only selects a tree budget, and the decoder
verifies every drafted token against the target, so outputs are lossless under any budget or policy.
"""

from __future__ import annotations

import io
import json
import re
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from treewise.decoder import TreewiseError
from treewise.decoder.paths import data_dir
from treewise.decoder.records.atomic import write_bytes_atomic

CLASSIFIER_FILE = "domain_classifier.npz"
FORMAT_VERSION = 1
BUILD_COMMAND = "treewise train-domains --suite data/prompts --out data/domain_classifier.npz"
_WORD = re.compile(r"\w+")
# Odd 64-bit constants for the rolling n-gram hash and its final mix (splitmix64 finaliser).
_PRIME = np.uint64(0x100000001B3)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = 0x9E3779B97F4A7C15


class DomainClassifierError(TreewiseError):
    """The domain classifier file is missing or malformed, or training data is unusable."""


class DomainClassifierConfig(BaseModel):
    """Features and smoothing of the domain classifier (the only copy of these defaults)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    char_ngram_min: int = Field(1, ge=1, le=8)
    char_ngram_max: int = Field(4, ge=1, le=8)
    word_unigrams: bool = True
    buckets: int = Field(2**15, ge=2**8, le=2**22, description="hashed feature buckets (model size)")
    alpha: float = Field(0.1, gt=0.0, le=10.0, description="additive (Lidstone) smoothing of bucket counts")
    sublinear_tf: bool = Field(True, description="count log(1 + n): one repeated n-gram should not dominate")
    lowercase: bool = False  # case is a signal (code identifiers, headings), so kept by default
    max_chars: int = Field(4000, ge=16, description="only the prompt's first characters: bounds predict time")

    @model_validator(mode="after")
    def _range(self) -> DomainClassifierConfig:
        if self.char_ngram_min > self.char_ngram_max:
            raise ValueError(f"char_ngram_min {self.char_ngram_min} > char_ngram_max {self.char_ngram_max}")
        return self


class LabeledPrompt(Protocol):
    """Anything with a prompt text and a domain label (``studies.shared.suites.Prompt`` fits)."""

    @property
    def prompt(self) -> str: ...

    @property
    def domain(self) -> str: ...


def _offset(kind: int) -> np.uint64:
    """A distinct 64-bit offset per feature kind (n-gram order, words), so kinds rarely share buckets."""
    return np.uint64((kind * _GOLDEN) % 2**64)


def _mix(h: np.ndarray) -> np.ndarray:
    """Scramble 64-bit values so that ``% buckets`` spreads them evenly (uint64 arithmetic wraps)."""
    h = h ^ (h >> np.uint64(30))
    h = h * _MIX1
    h = h ^ (h >> np.uint64(27))
    h = h * _MIX2
    return h ^ (h >> np.uint64(31))


def _features(text: str, config: DomainClassifierConfig) -> tuple[np.ndarray, np.ndarray]:
    """Bucket ids and their (sublinear) weights for one text; deterministic across processes."""
    text = text[: config.max_chars]
    if config.lowercase:
        text = text.lower()
    # Spaces at both ends mark the text's start and end as n-gram context.
    codes = np.frombuffer(f" {text} ".encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    parts: list[np.ndarray] = []
    h = codes
    for n in range(1, config.char_ngram_max + 1):
        if n > 1:  # extend every (n-1)-gram by the next character
            h = h[:-1] * _PRIME + codes[n - 1 :]
        if n >= config.char_ngram_min and h.size:
            parts.append(_mix(h + _offset(n)))
    if config.word_unigrams:
        words = _WORD.findall(text if config.lowercase else text.lower())
        if words:
            crc = np.fromiter((zlib.crc32(w.encode("utf-8")) for w in words), dtype=np.uint64, count=len(words))
            parts.append(_mix(crc + _offset(config.char_ngram_max + 1)))
    ids = np.concatenate(parts) % np.uint64(config.buckets)
    buckets, counts = np.unique(ids.astype(np.int64), return_counts=True)
    weights = np.log1p(counts) if config.sublinear_tf else counts.astype(np.float64)
    return buckets, weights.astype(np.float32)


class DomainClassifier:
    """Multinomial naive Bayes over hashed n-gram buckets. See the module docstring."""

    def __init__(self, labels: Sequence[str], log_prob: np.ndarray, log_prior: np.ndarray,
                 config: DomainClassifierConfig) -> None:
        self.labels: tuple[str, ...] = tuple(labels)
        self.log_prob = np.ascontiguousarray(log_prob, dtype=np.float32)  # classes x buckets
        self.log_prior = np.asarray(log_prior, dtype=np.float32)
        self.config = config
        if self.log_prob.shape != (len(self.labels), config.buckets) or self.log_prior.shape != (len(self.labels),):
            raise DomainClassifierError(
                f"classifier tables have shapes {self.log_prob.shape} and {self.log_prior.shape}, expected "
                f"({len(self.labels)}, {config.buckets}) and ({len(self.labels)},); rebuild it: {BUILD_COMMAND}"
            )

    @classmethod
    def fit(cls, texts: Sequence[str], labels: Sequence[str],
            config: DomainClassifierConfig | None = None) -> DomainClassifier:
        """Count hashed features per domain and smooth them; needs at least two domains."""
        config = config or DomainClassifierConfig()
        if len(texts) != len(labels):
            raise DomainClassifierError(f"{len(texts)} texts but {len(labels)} labels: pass one label per text")
        classes = sorted(set(labels))
        if len(classes) < 2:
            raise DomainClassifierError(
                f"training data holds {len(classes)} domain(s) {classes}; a classifier needs at least two"
            )
        index = {c: i for i, c in enumerate(classes)}
        counts = np.zeros((len(classes), config.buckets), dtype=np.float64)
        docs = np.zeros(len(classes), dtype=np.float64)
        for text, label in zip(texts, labels, strict=True):
            buckets, weights = _features(text, config)
            counts[index[label], buckets] += weights
            docs[index[label]] += 1
        smoothed = counts + config.alpha
        log_prob = np.log(smoothed) - np.log(smoothed.sum(axis=1, keepdims=True))
        return cls(classes, log_prob, np.log(docs / docs.sum()), config)

    def scores(self, text: str) -> np.ndarray:
        """Unnormalised log posterior per domain (in ``labels`` order)."""
        buckets, weights = _features(text, self.config)
        return self.log_prior + self.log_prob[:, buckets] @ weights

    def predict(self, text: str) -> str:
        """The most probable domain of ``text``. A wrong guess only costs speed, never correctness."""
        return self.labels[int(np.argmax(self.scores(text)))]

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray:
        """``len(texts) x len(labels)`` posterior probabilities (naive Bayes: sharp, rank them, don't trust them)."""
        out = np.empty((len(texts), len(self.labels)), dtype=np.float64)
        for row, text in enumerate(texts):
            s = self.scores(text).astype(np.float64)
            e = np.exp(s - s.max())
            out[row] = e / e.sum()
        return out

    def resolve(self, domain: str, text: str) -> str:
        """``domain`` itself, or the predicted domain when it is ``"auto"``."""
        return self.predict(text) if domain == "auto" else domain

    def save(self, path: str | Path) -> Path:
        """Write a compressed .npz atomically (temp file in the same folder, then ``os.replace``)."""
        file = Path(path)
        buffer = io.BytesIO()
        np.savez_compressed(
            buffer, format_version=np.array(FORMAT_VERSION), labels=np.array(self.labels, dtype=str),
            log_prob=self.log_prob, log_prior=self.log_prior, config=np.array(self.config.model_dump_json()),
        )
        return write_bytes_atomic(file, buffer.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> DomainClassifier:
        """Read a classifier written by :meth:`save`; errors name the file and how to rebuild it."""
        file = Path(path)
        if not file.exists():
            raise DomainClassifierError(f"{file}: domain classifier not found; build it with: {BUILD_COMMAND}")
        try:
            with np.load(file, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
        except (OSError, ValueError, zlib.error) as err:
            raise DomainClassifierError(f"{file}: not a domain classifier .npz ({err}); rebuild it: "
                                        f"{BUILD_COMMAND}") from None
        missing = {"format_version", "labels", "log_prob", "log_prior", "config"} - set(arrays)
        if missing:
            raise DomainClassifierError(f"{file}: missing arrays {sorted(missing)}; rebuild it: {BUILD_COMMAND}")
        if int(arrays["format_version"]) != FORMAT_VERSION:
            raise DomainClassifierError(
                f"{file}: format_version {int(arrays['format_version'])}, this treewise reads {FORMAT_VERSION}; "
                f"rebuild it: {BUILD_COMMAND}"
            )
        try:
            config = DomainClassifierConfig.model_validate(json.loads(str(arrays["config"])))
        except (json.JSONDecodeError, ValidationError) as err:
            raise DomainClassifierError(f"{file}: invalid stored config ({err}); rebuild it: {BUILD_COMMAND}") from None
        try:
            return cls([str(x) for x in arrays["labels"]], arrays["log_prob"], arrays["log_prior"], config)
        except DomainClassifierError as err:
            raise DomainClassifierError(f"{file}: {err}") from None

    @classmethod
    def default(cls) -> DomainClassifier:
        """The shipped classifier, ``data_dir()/domain_classifier.npz``."""
        return cls.load(data_dir() / CLASSIFIER_FILE)


class DomainScore(BaseModel):
    n: int
    correct: int
    accuracy: float


class DomainReport(BaseModel):
    """Held-out quality of a domain classifier: accuracy overall and per domain, and the confusion matrix."""

    labels: list[str]
    n_train: int
    n_test: int
    accuracy: float
    per_domain: dict[str, DomainScore]
    confusion: list[list[int]] = Field(description="rows: true domain, columns: predicted, in `labels` order")
    predict_us_median: float = Field(description="median wall time of one predict() on the test prompts")
    config: DomainClassifierConfig


@dataclass(frozen=True)
class DomainTraining:
    classifier: DomainClassifier
    report: DomainReport


def evaluate_classifier(classifier: DomainClassifier, test: Sequence[LabeledPrompt], n_train: int) -> DomainReport:
    """Accuracy, per-domain accuracy, confusion and predict latency on ``test``."""
    labels = list(classifier.labels)
    unknown = sorted({p.domain for p in test} - set(labels))
    if unknown:
        raise DomainClassifierError(f"test domains {unknown} have no training prompts; add train-split prompts")
    index = {c: i for i, c in enumerate(labels)}
    confusion = np.zeros((len(labels), len(labels)), dtype=np.int64)
    times = []
    for p in test:
        start = time.perf_counter()
        guess = classifier.predict(p.prompt)
        times.append(time.perf_counter() - start)
        confusion[index[p.domain], index[guess]] += 1
    per_domain = {
        c: DomainScore(n=int(confusion[i].sum()), correct=int(confusion[i, i]),
                       accuracy=float(confusion[i, i] / confusion[i].sum()))
        for i, c in enumerate(labels) if confusion[i].sum()
    }
    return DomainReport(
        labels=labels, n_train=n_train, n_test=len(test), accuracy=float(np.trace(confusion) / len(test)),
        per_domain=per_domain, confusion=confusion.tolist(), predict_us_median=float(np.median(times) * 1e6),
        config=classifier.config,
    )


def train_domain_classifier(train: Sequence[LabeledPrompt], test: Sequence[LabeledPrompt],
                            config: DomainClassifierConfig | None = None) -> DomainTraining:
    """Fit on ``train`` (a suite's train split) and report on ``test`` (its test split)."""
    if not train or not test:
        raise DomainClassifierError(
            f"need train and test prompts, got {len(train)} train and {len(test)} test; "
            "check the suite's `split` fields"
        )
    classifier = DomainClassifier.fit([p.prompt for p in train], [p.domain for p in train], config)
    return DomainTraining(classifier, evaluate_classifier(classifier, test, n_train=len(train)))
