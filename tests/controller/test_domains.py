"""domain="auto" classifier: accuracy on a separable synthetic suite, persistence, errors, and the CLI."""

import json
import random

import numpy as np
import pytest
from typer.testing import CliRunner

from treewise.controller.domains import (
    BUILD_COMMAND,
    CLASSIFIER_FILE,
    DomainClassifier,
    DomainClassifierConfig,
    DomainClassifierError,
    _features,
    train_domain_classifier,
)
from treewise.decoder.paths import data_dir
from treewise.studies.cli import app
from treewise.studies.learn.data import train_on_suite
from treewise.studies.shared.suites import Prompt, load_suite

_WORDS = {
    "code": ["def", "return", "import", "class", "self", "for", "in", "range", "print", "lambda", "None", "yield"],
    "math": ["solve", "integer", "sum", "product", "equation", "divide", "prime", "fraction", "compute", "digits"],
    "dialogue": ["hello", "thanks", "friend", "how", "are", "you", "weekend", "great", "sorry", "chat", "nice"],
}
_SHAPES = {
    "code": lambda r, w: f"{w[0]} f{r.randint(0, 99)}(x):\n    {w[1]} x.{w[2]}() + {r.randint(0, 9)}  # {w[3]}",
    "math": lambda r, w: f"{w[0].capitalize()} {r.randint(2, 999)} * {r.randint(2, 99)} = ? Then {w[1]} {w[2]}.",
    "dialogue": lambda r, w: f"{w[0].capitalize()}, {w[1]} {w[2]}! {w[3].capitalize()} {w[4]} today?",
}


def _make_suite(tmp_path, per_domain: int = 40):
    """Three clearly separable domains, disjoint random draws per split; a test may fail if the model is broken."""
    rng = random.Random(7)
    folder = tmp_path / "suite"
    folder.mkdir()
    for domain, words in _WORDS.items():
        lines = []
        for i in range(per_domain):
            text = _SHAPES[domain](rng, rng.sample(words, 5))
            split = "test" if i % 4 == 0 else "train"
            lines.append(json.dumps({"id": f"{domain}-{i}", "domain": domain, "prompt": text, "split": split}))
        (folder / f"{domain}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def _suite_prompts(tmp_path, split: str) -> list[Prompt]:
    folder = tmp_path / "suite"
    return load_suite(folder if folder.exists() else _make_suite(tmp_path), split)


def test_separable_suite_accuracy(tmp_path) -> None:
    training = train_on_suite(_make_suite(tmp_path))
    report = training.report
    assert report.n_test == 30 and report.n_train == 90
    assert report.accuracy > 0.9
    assert set(report.per_domain) == set(_WORDS)
    assert np.trace(np.array(report.confusion)) == sum(s.correct for s in report.per_domain.values())
    assert training.classifier.predict("def g(y):\n    return y.print()") == "code"
    assert training.classifier.predict("Hello friend, how are you?") == "dialogue"


def test_wrong_labels_are_not_learned(tmp_path) -> None:
    """Shuffled labels must not score like real ones: guards against evaluating on the training labels."""
    prompts = [p for split in ("train", "test") for p in _suite_prompts(tmp_path, split)]
    rng = random.Random(0)
    labels = [p.domain for p in prompts]
    rng.shuffle(labels)
    shuffled = [p.model_copy(update={"domain": d}) for p, d in zip(prompts, labels, strict=True)]
    training = train_domain_classifier([p for p in shuffled if p.split == "train"],
                                       [p for p in shuffled if p.split == "test"])
    assert training.report.accuracy < 0.7


def test_save_load_identical(tmp_path) -> None:
    classifier = train_on_suite(_make_suite(tmp_path)).classifier
    path = classifier.save(tmp_path / "model" / "clf.npz")
    loaded = DomainClassifier.load(path)
    texts = [p.prompt for p in _suite_prompts(tmp_path, "test")] + ["", "x" * 5000]
    assert loaded.labels == classifier.labels and loaded.config == classifier.config
    np.testing.assert_array_equal(loaded.predict_proba(texts), classifier.predict_proba(texts))
    assert [p.name for p in path.parent.iterdir()] == ["clf.npz"]  # atomic write leaves no temp file
    assert path.stat().st_mode & 0o777 == 0o644


def test_predict_proba_rows_sum_to_one(tmp_path) -> None:
    classifier = train_on_suite(_make_suite(tmp_path)).classifier
    proba = classifier.predict_proba(["def h(): return 1", "Solve 12 * 4", ""])
    assert proba.shape == (3, 3)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert classifier.labels[int(proba[0].argmax())] == "code"


def test_resolve_only_classifies_auto(tmp_path) -> None:
    classifier = train_on_suite(_make_suite(tmp_path)).classifier
    assert classifier.resolve("auto", "Solve 17 * 3 = ? Then compute digits.") == "math"
    assert classifier.resolve("code", "Solve 17 * 3 = ? Then compute digits.") == "code"


def test_hash_is_pinned() -> None:
    """Saved models depend on the bucket of each n-gram: the hash must not change across runs or versions."""
    buckets, weights = _features("ab", DomainClassifierConfig(buckets=1024))
    assert buckets.tolist() == [1, 138, 277, 315, 352, 433, 500, 659, 685, 874]
    # " ab ": the space unigram occurs twice, every other feature once.
    assert sorted(weights.tolist()) == pytest.approx(sorted([np.log(3.0)] + [np.log(2.0)] * 9))


def test_missing_model_names_build_command(tmp_path, monkeypatch) -> None:
    with pytest.raises(DomainClassifierError, match="not found") as info:
        DomainClassifier.load(tmp_path / "absent.npz")
    assert BUILD_COMMAND in str(info.value) and "absent.npz" in str(info.value)
    monkeypatch.setenv("TREEWISE_DATA", str(tmp_path))
    with pytest.raises(DomainClassifierError, match="train-domains"):
        DomainClassifier.default()


def test_corrupt_model_is_an_error(tmp_path) -> None:
    path = tmp_path / "bad.npz"
    path.write_bytes(b"not a zip")
    with pytest.raises(DomainClassifierError, match="bad.npz"):
        DomainClassifier.load(path)
    np.savez(path, labels=np.array(["a", "b"]))
    with pytest.raises(DomainClassifierError, match="missing arrays"):
        DomainClassifier.load(path)


def test_fit_needs_two_domains() -> None:
    with pytest.raises(DomainClassifierError, match="at least two"):
        DomainClassifier.fit(["a", "b"], ["x", "x"])
    with pytest.raises(ValueError, match="char_ngram_min"):
        DomainClassifierConfig(char_ngram_min=5, char_ngram_max=2)


def test_cli_end_to_end(tmp_path) -> None:
    out, report = tmp_path / "out" / "clf.npz", tmp_path / "report.json"
    res = CliRunner().invoke(app, ["train-domains", "--suite", str(_make_suite(tmp_path)), "--out", str(out),
                                   "--json", str(report), "--buckets", "4096"])
    assert res.exit_code == 0, res.output
    data = json.loads(report.read_text())
    assert data["accuracy"] > 0.9 and data["config"]["buckets"] == 4096
    assert set(data["per_domain"]) == set(_WORDS)
    assert DomainClassifier.load(out).config.buckets == 4096
    assert "confusion" in res.output and "dialogue" in res.output


def test_cli_reports_missing_suite(tmp_path) -> None:
    res = CliRunner().invoke(app, ["train-domains", "--suite", str(tmp_path / "missing"),
                                   "--out", str(tmp_path / "clf.npz")])
    assert res.exit_code == 2
    assert "does not exist" in " ".join(res.output.split()) and not (tmp_path / "clf.npz").exists()


def test_shipped_classifier_loads() -> None:
    """The committed data/domain_classifier.npz matches this code's format and the suite's domains."""
    if not (data_dir() / CLASSIFIER_FILE).exists():
        pytest.skip(f"no {data_dir() / CLASSIFIER_FILE} (build it with {BUILD_COMMAND})")
    classifier = DomainClassifier.default()
    assert len(classifier.labels) >= 2
    assert classifier.predict_proba(["def add(a, b):\n    return a + b\n"]).shape == (1, len(classifier.labels))
