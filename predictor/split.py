"""Train / validation / test split by prompt group, stratified by domain, saved with the model."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class PromptSplit:
    """Group keys (prompt ids, or run_id + prompt_id requests) on each side; no key is on two sides."""

    train: list[str]
    valid: list[str]
    test: list[str]

    def to_dict(self) -> dict[str, list[str]]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, list[str]]) -> PromptSplit:
        return cls(train=list(data["train"]), valid=list(data["valid"]), test=list(data["test"]))

    def masks(self, group: np.ndarray) -> SplitMasks:
        """Row masks; groups the split never saw (new logs) count as test."""
        train = np.isin(group, np.asarray(self.train, dtype=object))
        valid = np.isin(group, np.asarray(self.valid, dtype=object))
        return SplitMasks(train=train, valid=valid, test=~(train | valid))


@dataclass(frozen=True)
class SplitMasks:
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray


def split_by_prompt(
    group: np.ndarray, domain: np.ndarray, train_fraction: float, valid_fraction: float, seed: int
) -> PromptSplit:
    """Shuffle each domain's groups with the seed and cut them by the fractions.

    Per domain so that every domain has validation and test prompts when it has at least three.
    """
    keys, first = np.unique(group, return_index=True)
    group_domain = domain[first]
    rng = np.random.default_rng(seed)
    train: list[str] = []
    valid: list[str] = []
    test: list[str] = []
    for dom in sorted(set(group_domain.tolist())):
        members = [str(k) for k in keys[group_domain == dom]]
        members = [members[i] for i in rng.permutation(len(members))]
        n = len(members)
        n_valid = max(1, round(valid_fraction * n)) if n >= 3 else 0
        n_test = max(1, round((1 - train_fraction - valid_fraction) * n)) if n >= 3 else 0
        n_train = n - n_valid - n_test
        train += members[:n_train]
        valid += members[n_train : n_train + n_valid]
        test += members[n_train + n_valid :]
    return PromptSplit(sorted(train), sorted(valid), sorted(test))
