"""Defaults of the pair's commands (train-pair, pair-report, demo): light, so the CLI is built without torch."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from treewise.studies.shared.paths import PAIR_POLICIES, data_dir

from .corpus.build import CorpusConfig


class ModelShape(BaseModel):
    layers: int = Field(ge=1)
    hidden: int = Field(ge=8)
    heads: int = Field(ge=1)
    ffn: int = Field(ge=8)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelShape:
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise ValueError(f"hidden {self.hidden} must split into {self.heads} heads of an even size (RoPE)")
        return self


class PairConfig(BaseModel):
    """Defaults of `treewise train-pair` (the CLI reads them from here)."""

    minutes: float = 70.0  # training budget for both models together (corpus and tokenizer not counted)
    threads: int = 2
    out: Path = Path("data/models")
    work: Path = Path("runs/pair")
    seed: int = 1234
    vocab_size: int = 6144
    context: int = 512  # max_position_embeddings; every `long_every`-th step trains on windows this long
    window: int = 256  # other steps use shorter windows: attention backward on CPU is costly at 512
    batch: int = 16  # rows per step at `window` tokens (a quarter of that on long steps)
    long_every: int = 6
    target: ModelShape = ModelShape(layers=12, hidden=192, heads=3, ffn=512)
    draft: ModelShape = ModelShape(layers=1, hidden=128, heads=2, ffn=384)
    target_share: float = 0.72  # of the minutes; the draft step also runs the target forward (distillation)
    lr_target: float = 2e-3
    lr_draft: float = 3e-3
    distill_weight: float = 0.7  # draft loss = w * KL(target || draft) + (1 - w) * cross-entropy
    checkpoint_every_s: float = 180.0
    corpus: CorpusConfig = CorpusConfig()
    # Warm start: a folder with target/ and draft/ from an earlier run on the same tokenizer; each stage starts
    # from those weights (with a fresh optimizer and schedule) unless `work` already holds its checkpoint.
    init_from: Path | None = None
    device: str = "auto"  # "auto": CUDA when present (a larger pair fits a GPU's budget), else the CPU


class EvalConfig(BaseModel):
    """Defaults of `treewise pair-report`."""

    models: Path = Path("data/models")
    work: Path = Path("runs/pair")
    prompts: Path = Path("data/prompts")
    windows: int = 12  # held-out windows of `window` tokens per domain
    window: int = 512
    gen_prompts: int = 8  # test prompts per domain decoded greedily for repetition and samples
    gen_tokens: int = 96
    threads: int = 2


class DemoConfig(BaseModel):
    """Defaults of `treewise demo`."""

    per_domain: int = 2
    max_new_tokens: int = 48  # keeps the demo under a minute on 2 shared cores
    tree: str | None = None  # a tree spec overriding ``trees``
    threads: int = 2
    pair: str | None = None  # a controller.pairs name; None: $TREEWISE_PAIR, else the real pair (smollm2)
    host: bool = True  # price trees by this host's cost curve (controller.host), else by the shipped one
    precision: str = "exact"  # float32; "fast": bfloat16 where the CPU has bf16 hardware (decoder.loading)

    def tree_for(self, pair: str) -> str:
        """The tree spec the demo decodes ``pair`` with: ``tree`` when set, else the pair's shipped policy
        (``PAIR_POLICIES``, which ``treewise.load`` decodes with too)."""
        return self.tree or PAIR_POLICIES.get(pair, PAIR_POLICIES["micro"])


class DistillConfig(BaseModel):
    """``treewise pair train-draft``: a draft for a real target, distilled from ``treewise pair teacher``'s shards."""

    teacher: Path = Path("runs/smollm2-teacher")  # shards of ``treewise pair teacher``
    target: Path | None = None  # None: the fetched SmolLM2
    work: Path = Path("runs/smollm2-draft")  # checkpoint and state (resumable)
    out: Path = Field(default_factory=lambda: data_dir() / "models" / "smollm2-draft")  # the exported folder
    layers: int = 1  # 2 layers scored no better held out at equal CPU time and cost 40% more per level
    init_layers: tuple[int, ...] | None = None  # target layers copied into the draft's; None: the first ``layers``
    vocab: int = 8192  # kept target tokens (K); the draft has K + 1 rows
    minutes: float = 24.0  # the shipped draft's; ~80k answer tokens, not CPU time, limit it (docs/real-pair.md)
    batch_tokens: int = 4096  # padded tokens per optimiser step
    lr: float = 2e-3  # 5e-4 left a one-layer draft far from fitting in the same time (docs/real-pair.md)
    heldout_every: int = 16  # one prompt in this many is held out (by a hash of its id)
    checkpoint_every_s: float = 120.0
    select_every_s: float = 240.0  # held-out loss scored this often (at a checkpoint); the lowest one is exported
    threads: int = 2
    seed: int = 0


class FeatureTrainConfig(BaseModel):
    """``treewise pair train-draft --kind feature``: the feature draft, trained on ``treewise pair features``."""

    model_config = ConfigDict(extra="forbid")

    features: tuple[Path, ...]  # `treewise pair features` folders
    target: Path
    to_target: Path  # a draft folder whose kept-token map the feature draft uses (the standalone draft's)
    test: tuple[Path, ...] = ()  # features of the test split's teacher answers: the card's per-domain figures
    work: Path = Path("runs/smollm2-feature-draft")  # checkpoint (resumable)
    # A feature draft folder a fresh run starts from (e.g. the shipped one, so training adds up across machines
    # whose caches start empty); a checkpoint in ``work`` wins over it.
    init: Path | None = None
    out: Path = Field(default_factory=lambda: data_dir() / "models" / "smollm2-feature-draft")  # the exported folder
    minutes: float = 40.0  # training budget across restarts
    batch_tokens: int = 4096
    max_len: int = 512  # slots of a conversation per training row (its start)
    passes: int = 3  # 1: teacher features only; more: also the draft's own (training-time test)
    reg_weight: float = 1.0
    lr: float = 1e-3
    heldout_every: int = 50
    checkpoint_every_s: float = 120.0
    threads: int = 2
    seed: int = 0
