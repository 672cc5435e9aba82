"""Collect node logs at scale: run the decoder over a prompt suite, one atomic record per prompt.

Library only (returns data); `treewise collect` in ``studies.collect.cli`` prints. The on-disk
layout and its crash-safety are described in ``studies.shared.runs``.
"""

from __future__ import annotations

import hashlib
import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel

from treewise.decoder import SCHEMA_VERSION, GenerationResult, NodeLogWriter, TreeDecoder, TreewiseError
from treewise.studies.shared.locks import FileLock
from treewise.studies.shared.pairs import load_pair_decoder, resolve_pair
from treewise.studies.shared.runs import (
    PromptRecord,
    RunManifest,
    ShardLayout,
    StepColumns,
    create_manifest,
    drop_damaged,
    export_shard_logs,
    read_records,
    remove_orphans,
    write_json_atomic,
)
from treewise.studies.shared.suites import Prompt, load_suite
from treewise.studies.shared.treespec import parse_tree_spec

from .config import CollectConfig


def parse_shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise TreewiseError(f"--shard {text!r}: use I/N, for example 1/4 (shards count from 1)") from None
    if not 1 <= index <= count:
        raise TreewiseError(f"--shard {text!r}: need 1 <= I <= N (shards count from 1)")
    return index, count


def suite_fingerprint(prompts: list[Prompt]) -> str:
    h = hashlib.sha256()
    for p in prompts:
        h.update(f"{p.id}\0{p.domain}\0{p.prompt}\0".encode())
    return h.hexdigest()[:16]


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("treewise", "torch", "transformers", "numpy", "pyarrow"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed (source tree)"
    try:
        repo = Path(__file__).resolve().parents[2]
        sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=False).stdout.strip()
        out["git_commit"] = sha or "unknown"
    except (OSError, subprocess.SubprocessError):
        out["git_commit"] = "unknown"
    return out


def model_fingerprint(path: Path, chunk: int = 1 << 20) -> str:
    """Hash of a model folder's file names, sizes, and first and last MiB: cheap even for large weights."""
    if not path.is_dir():
        return f"hub:{path}"
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        size = f.stat().st_size
        h.update(f"{f.relative_to(path)}\0{size}\0".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(chunk))
            if size > chunk:
                fh.seek(max(chunk, size - chunk))
                h.update(fh.read(chunk))
    return h.hexdigest()[:16]


@dataclass
class CollectPlan:
    """Everything decided before a model is loaded: this shard's prompts and which are finished."""

    config: CollectConfig
    layout: ShardLayout
    manifest: RunManifest
    prompts: list[Prompt]  # this shard's prompts, suite order
    done: set[str]
    orphans_removed: int
    damaged: list[str] = field(default_factory=list)  # prompts whose node file was damaged: re-collected
    lock: FileLock | None = None  # this shard's writer lock, held from planning until the run ends

    @property
    def pending(self) -> list[Prompt]:
        return [p for p in self.prompts if p.id not in self.done]

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()


def plan_collect(config: CollectConfig) -> CollectPlan:
    """Validate settings, assign prompts to the shard, reconcile with what is on disk."""
    spec = parse_tree_spec(config.tree)
    spec.build(config.pair)  # a bad value (width=0) fails now, not after the models load
    index, count = parse_shard(config.shard)
    split = None if config.split == "all" else config.split
    everything = load_suite(config.suite, split=split, domains=config.domains)
    if not everything:
        raise TreewiseError(f"suite {config.suite} has no prompts for split={config.split} "
                            f"domains={config.domains or 'all'}: check --split / --domain")
    mine = [p for i, p in enumerate(everything) if i % count == index - 1]  # round-robin: balanced domains
    pair = resolve_pair(config.pair, config.target, config.draft)  # the real target is fetched on first use
    target, draft = Path(pair.target), Path(pair.draft)
    config = config.model_copy(update={"pair": pair.name, "target": target, "draft": draft})
    manifest = RunManifest(
        tree=spec.canonical, temperature=config.temperature, max_new_tokens=config.max_new_tokens,
        seed=config.seed, suite=str(Path(config.suite).resolve()), split=config.split, domains=config.domains,
        shards=count, prompts=len(everything), suite_fingerprint=suite_fingerprint(everything),
        target=str(target.resolve()), draft=str(draft.resolve()),
        target_fingerprint=model_fingerprint(target), draft_fingerprint=model_fingerprint(draft),
        node_schema_version=SCHEMA_VERSION, versions=versions(),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    run_dir = Path(config.out)
    manifest = create_manifest(run_dir, manifest)
    layout = ShardLayout(run_dir, index, count)
    # One writer per shard: a second one would delete the first's unfinished node files as orphans.
    lock = FileLock(layout.lock_path, f"shard {index}/{count} of {run_dir}").acquire()
    try:
        records, damaged = drop_damaged(layout, read_records(layout.records_dir))
        removed = remove_orphans(layout, records)
    except BaseException:
        lock.release()
        raise
    return CollectPlan(config, layout, manifest, mine, {r.prompt_id for r in records}, removed, damaged, lock)


def load_decoder(config: CollectConfig) -> TreeDecoder:
    """The pair of ``config`` (``plan.config``: its folders filled in by ``plan_collect``)."""
    pair = resolve_pair(config.pair, config.target, config.draft)
    for role, path in (("target", pair.target), ("draft", pair.draft)):
        if not Path(path).exists() and not _looks_like_hub_id(Path(path)):
            raise TreewiseError(f"{role} model {path} not found: train the embedded pair with `treewise "
                                f"train-pair`, or pass --target PATH --draft PATH")
    return load_pair_decoder(pair, device=config.device)


def _looks_like_hub_id(path: Path) -> bool:
    text = str(path)
    return not text.startswith((".", "/")) and text.count("/") == 1


def _prompt_seed(config: CollectConfig, prompt_id: str) -> int | None:
    """Sampled runs: a per-prompt seed, stable across resumes and shards."""
    if config.temperature == 0:
        return None
    return (config.seed * 1_000_003 + int(hashlib.sha1(prompt_id.encode()).hexdigest()[:8], 16)) % 2**31


def collect_prompt(plan: CollectPlan, decoder: TreeDecoder, prompt: Prompt,
                   on_record: Callable[[PromptRecord], None] | None = None) -> PromptRecord:
    """Decode one prompt, write its node file, then its record (the commit)."""
    return collect_batch(plan, decoder, [prompt], on_record)[0]


def collect_batch(plan: CollectPlan, decoder: TreeDecoder, prompts: list[Prompt],
                  on_record: Callable[[PromptRecord], None] | None = None) -> list[PromptRecord]:
    """Decode prompts together (``generate_batch`` with continuous batching: ``batch_size`` rows at once, a
    waiting prompt joins when a row ends; one prompt: ``generate``) and commit each prompt as its row ends:
    its node file, then its record, then ``on_record``. A kill loses only rows still decoding. Batched rows
    log the same node rows as solo decoding."""
    cfg, layout = plan.config, plan.layout
    writers = [NodeLogWriter(layout.nodes_dir, flush_every=1, prefix=f"nodes-{Path(layout.record_path(p.id)).stem}")
               for p in prompts]
    kw = dict(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, run_id=layout.run_dir.name)
    tree = parse_tree_spec(cfg.tree).build(cfg.pair)
    records: dict[int, PromptRecord] = {}

    def commit(i: int, out: GenerationResult) -> None:
        records[i] = _commit_prompt(plan, decoder, prompts[i], out, writers[i])
        if on_record is not None:
            on_record(records[i])

    if len(prompts) == 1:
        p = prompts[0]
        commit(0, decoder.generate(p.prompt, tree=tree, seed=_prompt_seed(cfg, p.id), domain=p.domain,
                                   prompt_id=p.id, log=writers[0], **kw))
    else:
        decoder.generate_batch([p.prompt for p in prompts], tree=tree, seed=[_prompt_seed(cfg, p.id) for p in prompts],
                               domain=[p.domain for p in prompts], prompt_ids=[p.id for p in prompts],
                               log=list(writers), max_batch=cfg.batch_size, on_finish=commit, **kw)
    return [records[i] for i in sorted(records)]


def _commit_prompt(plan: CollectPlan, decoder: TreeDecoder, prompt: Prompt, out: GenerationResult,
                   writer: NodeLogWriter) -> PromptRecord:
    cfg, layout = plan.config, plan.layout
    node_file = writer.written[-1] if writer.written else None
    greedy_match, plain_s = None, None
    if cfg.temperature == 0 and cfg.check_greedy:
        plain = decoder.generate_plain(prompt.prompt, max_new_tokens=cfg.max_new_tokens)
        greedy_match, plain_s = plain.token_ids == out.token_ids, plain.stats.total_s
    st = out.stats
    steps = StepColumns(**{f: [getattr(s, f) for s in st.steps] for f in StepColumns.model_fields})
    record = PromptRecord(
        prompt_id=prompt.id, domain=prompt.domain, split=prompt.split, shard=layout.name,
        node_file=str(node_file.relative_to(layout.run_dir)) if node_file else None,
        node_rows=st.drafted, prompt_tokens=len(out.prompt_ids), new_tokens=st.new_tokens, n_steps=st.n_steps,
        drafted=st.drafted, verified=st.verified, accepted=st.accepted, tau=st.tau,
        finish_reason=out.finish_reason, total_s=st.total_s, tokens_per_s=st.tokens_per_s,
        greedy_checked=greedy_match is not None, greedy_match=greedy_match, plain_s=plain_s, text=out.text,
        steps=steps,
    )
    write_json_atomic(layout.record_path(prompt.id), record)
    return record


class DomainSummary(BaseModel):
    prompts: int = 0
    steps: int = 0
    new_tokens: int = 0
    accepted: int = 0
    tau: float = 0.0  # 1 + accepted / steps
    tokens_per_s: float = 0.0
    greedy_checked: int = 0
    greedy_mismatches: int = 0


class CollectSummary(BaseModel):
    run_dir: str
    shard: str
    tree: str
    planned: int  # prompts of this shard
    finished: int  # with a record, this call's and earlier ones
    collected_now: int
    skipped: int  # finished by an earlier call
    failed: dict[str, str]  # prompt id -> error; not recorded, so a rerun tries them again
    orphans_removed: int
    complete: bool
    elapsed_s: float
    domains: dict[str, DomainSummary]
    greedy_checked: int
    greedy_mismatches: int


def summarize(plan: CollectPlan, records: list[PromptRecord], collected_now: int,
              failed: dict[str, str], elapsed_s: float) -> CollectSummary:
    domains: dict[str, DomainSummary] = {}
    seconds: dict[str, float] = {}
    for r in records:
        d = domains.setdefault(r.domain, DomainSummary())
        d.prompts += 1
        d.steps += r.n_steps
        d.new_tokens += r.new_tokens
        d.accepted += r.accepted
        d.greedy_checked += r.greedy_checked
        d.greedy_mismatches += r.greedy_match is False
        seconds[r.domain] = seconds.get(r.domain, 0.0) + r.total_s
    for name, d in domains.items():
        d.tau = 1.0 + d.accepted / d.steps if d.steps else 0.0
        d.tokens_per_s = d.new_tokens / seconds[name] if seconds[name] else 0.0
    mine = {p.id for p in plan.prompts}
    finished = sum(r.prompt_id in mine for r in records)
    return CollectSummary(
        run_dir=str(plan.layout.run_dir), shard=plan.layout.name, tree=plan.manifest.tree,
        planned=len(plan.prompts), finished=finished, collected_now=collected_now, skipped=len(plan.done),
        failed=failed, orphans_removed=plan.orphans_removed, complete=finished == len(plan.prompts),
        elapsed_s=elapsed_s, domains=dict(sorted(domains.items())),
        greedy_checked=sum(d.greedy_checked for d in domains.values()),
        greedy_mismatches=sum(d.greedy_mismatches for d in domains.values()),
    )


@dataclass
class ShardInfo:
    host: str = field(default_factory=platform.node)
    started: str = ""
    finished: str | None = None
    planned: int = 0
    done: int = 0
    versions: dict[str, str] = field(default_factory=dict)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_collect(plan: CollectPlan, decoder: TreeDecoder,
                on_prompt: Callable[[PromptRecord], None] | None = None) -> CollectSummary:
    """Decode every pending prompt of the shard; ``on_prompt`` sees each committed record. Releases the
    plan's lock when done."""
    try:
        return _run_pending(plan, decoder, on_prompt)
    finally:
        plan.release()


def _run_pending(plan: CollectPlan, decoder: TreeDecoder,
                 on_prompt: Callable[[PromptRecord], None] | None) -> CollectSummary:
    start = time.perf_counter()
    info = ShardInfo(started=_now(), planned=len(plan.prompts), done=len(plan.done), versions=versions())
    write_json_atomic(plan.layout.info_path, info.__dict__)
    failed: dict[str, str] = {}
    done: set[str] = set()

    def record(rec: PromptRecord) -> None:
        done.add(rec.prompt_id)
        if on_prompt is not None:
            on_prompt(rec)

    pending = plan.pending
    # One prompt at a time decodes solo; a batch size > 1 decodes the whole shard as one continuous batch.
    groups = [[p] for p in pending] if plan.config.batch_size == 1 else [pending] if pending else []
    for group in groups:
        try:
            collect_batch(plan, decoder, group, record)
        except TreewiseError:  # a refused prompt (too long, ...) refuses its batch: the rest one by one
            for prompt in (p for p in group if p.id not in done):
                try:
                    collect_prompt(plan, decoder, prompt, record)
                except TreewiseError as err:  # one refused prompt should not stop the shard
                    failed[prompt.id] = str(err)
    collected = len(done)
    records = read_records(plan.layout.records_dir)
    export_shard_logs(plan.layout, records)
    summary = summarize(plan, records, collected, failed, time.perf_counter() - start)
    info.done, info.finished = summary.finished, _now() if summary.complete else None
    write_json_atomic(plan.layout.info_path, info.__dict__)
    return summary


def collect(config: CollectConfig, on_prompt: Callable[[PromptRecord], None] | None = None) -> CollectSummary:
    """Plan, load the pair, run: the whole of `treewise collect` without the printing."""
    plan = plan_collect(config)
    try:
        if not plan.pending:
            return summarize(plan, read_records(plan.layout.records_dir), 0, {}, 0.0)
        return run_collect(plan, load_decoder(plan.config), on_prompt)
    finally:
        plan.release()
