"""LearnedRerank: ConfidenceTree's own drafted tree, with the verified nodes chosen by predicted path value.

Drafting is EAGLE-2's (``ConfidenceTree``): each level expands its ``top_k`` most likely nodes by draft path
probability, ``top_k`` children each. Only the final selection differs: instead of the best ``budget``
candidates by draft path probability, it keeps the best ``budget`` by predicted path value, the product of
the predictor's conditional acceptances along the path (LearnedTree's value: the same features, including
the request-context columns of ``predictor.derived``, and the same per-request online correction).

A path value never rises from parent to child (each factor is a probability), and ties are broken by
candidate index (parents come first), so the global top ``budget`` set is a connected tree. At equal
budgets the two policies verify the same number of nodes out of the same candidates; any difference in
tau is the selection's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from treewise.decoder import Candidates, Frontier, LevelPlan, RequestInfo, StepOutcome
from treewise.decoder.paths import data_dir
from treewise.predictor.derived import RequestFeatures
from treewise.predictor.online import OnlineCalibrator, OnlineConfig

from .learned import AcceptanceModel, tried_nodes
from .policies import ConfidenceTree


@dataclass
class LearnedRerank:
    predictor: AcceptanceModel
    budget: int = 32
    max_depth: int = 6
    top_k: int = 4
    online: OnlineConfig | None = field(default_factory=OnlineConfig)  # None: the global predictor as it is
    domain: str = field(default="unknown", init=False)
    _draft: ConfidenceTree = field(init=False, repr=False)
    _raw: list[np.ndarray] = field(default_factory=list, init=False, repr=False)  # global predictions, by level
    _value: list[np.ndarray] = field(default_factory=list, init=False, repr=False)  # path values, by level
    _parent: list[np.ndarray] = field(default_factory=list, init=False, repr=False)  # step-wide parent index
    _kept: np.ndarray | None = field(default=None, init=False, repr=False)  # this step's final selection
    _context: RequestFeatures = field(default_factory=RequestFeatures, init=False, repr=False)
    _calibrator: OnlineCalibrator = field(default_factory=OnlineCalibrator, init=False, repr=False)

    def __post_init__(self) -> None:
        self._draft = ConfidenceTree(self.budget, self.max_depth, self.top_k)  # validates the sizes
        if self.online is not None:
            self._calibrator = OnlineCalibrator(self.online)

    @classmethod
    def default(cls, budget: int = 32, max_depth: int = 6, top_k: int = 4, online: bool = True,
                predictor_dir: str | Path | None = None) -> LearnedRerank:
        """The shipped predictor (``data_dir()/predictor`` unless ``predictor_dir`` names another folder)."""
        from treewise.predictor import AcceptancePredictor

        model = AcceptancePredictor.load(Path(predictor_dir) if predictor_dir else data_dir() / "predictor")
        return cls(model, budget, max_depth, top_k, OnlineConfig() if online else None)

    # -- protocol ----------------------------------------------------------------------------------

    def start(self, request: RequestInfo) -> None:
        self.domain = request.domain
        self._context.start()
        self._calibrator.reset()
        self._begin_step()

    def plan(self, frontier: Frontier) -> LevelPlan:
        if frontier.depth == 0:
            self._begin_step()
            self._context.begin_step()
        else:
            self._predict(frontier)
        return self._draft.plan(frontier)

    def finalize(self, candidates: Candidates) -> torch.Tensor | None:
        value = self.path_values()
        if value.shape[0] != candidates.size:  # not the tree this policy saw drafted: EAGLE-2's own choice
            self._kept = None
            return self._draft.finalize(candidates)
        keep = np.zeros(value.shape[0], dtype=bool)
        keep[np.argsort(-value, kind="stable")[: self.budget]] = True  # ties: lower index (parents) first
        self._kept = keep
        return torch.from_numpy(keep)

    def observe(self, outcome: StepOutcome) -> None:
        self._context.observe(outcome.accepted, outcome.tried)
        if self.online is not None and outcome.verified > 0 and self._kept is not None:
            self._update_correction(outcome)

    # -- values ------------------------------------------------------------------------------------

    def path_values(self) -> np.ndarray:
        """Predicted path value of every candidate drafted so far this step, in candidate order."""
        return np.concatenate(self._value) if self._value else np.zeros(0)

    def _begin_step(self) -> None:
        self._raw, self._value, self._parent, self._kept = [], [], [], None

    def _predict(self, frontier: Frontier) -> None:
        """Conditional acceptance of every frontier candidate (LearnedTree's features), times its parent's value."""
        feats = frontier.features()
        feats["domain"] = np.full(frontier.size, self.domain, dtype=object)
        parent = frontier.parent.numpy()
        self._context.add(feats, parent)
        names = self.predictor.feature_names
        raw = np.asarray(self.predictor.predict_batch({n: feats[n] for n in names}), dtype=np.float64)
        p = self._calibrator(raw) if self.online is not None else raw
        prev = self.path_values()
        value = np.asarray(p, dtype=np.float64) if frontier.depth == 1 else prev[parent] * p
        self._raw.append(raw)
        self._value.append(value)
        self._parent.append(parent)

    def _update_correction(self, outcome: StepOutcome) -> None:
        """Update the request's correction with the step's tried nodes, labelled by the accepted path (as
        LearnedTree does)."""
        if self._kept is None:
            return
        tried = tried_nodes([(np.concatenate(self._raw), np.concatenate(self._parent), self._kept)], outcome)
        if tried is not None:
            self._calibrator.update(tried.raw, tried.accepted)
