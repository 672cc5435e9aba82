"""``treewise bench``, ``treewise decode`` and ``treewise latency``.

No torch at import: each command imports the decoder and controller when it runs, so ``--help`` is fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from treewise.studies.shared.commands import open_pair, write_text
from treewise.studies.shared.config import BenchConfig
from treewise.studies.shared.paths import PAIR_HELP

from .sweep_cli import sweep

if TYPE_CHECKING:
    from treewise.controller import LatencyProfile
    from treewise.decoder import DecodeConfig, TreeDecoder
    from treewise.studies.shared.measure import BenchResult

_B = BenchConfig()
_FROM_DECODER = "the decoder's DecodeConfig"


def _decode_defaults() -> DecodeConfig:
    from treewise.decoder import DEFAULTS

    return DEFAULTS


def _policy_spec(policy: str) -> str:
    """--policy NAME: kinds whose spec needs parameters get the decoder's defaults."""
    d = _decode_defaults()
    return {"static": f"static:width={d.width},depth={d.depth}", "chain": "chain:length=4"}.get(policy, policy)


def _compared(item: str) -> tuple[str, str]:
    a, colon, b = item.partition(":")
    if not colon or not a or not b:
        raise typer.BadParameter(f"--compare {item!r}: use A:B with two row names, e.g. learned:static")
    return a, b


def bench(
    suite: Annotated[Path, typer.Option(help="prompt suite folder")] = _B.suite,
    split: Annotated[str, typer.Option(help="train, tune, test or all")] = _B.split,
    domain: Annotated[list[str] | None, typer.Option(help="only these domains (repeatable)")] = None,
    per_domain: Annotated[int, typer.Option(help="prompts per domain, 0 = all")] = _B.per_domain,
    max_new_tokens: Annotated[int, typer.Option()] = _B.max_new_tokens,
    repeats: Annotated[int, typer.Option(help="interleaved repeats (median and spread)")] = _B.repeats,
    tree: Annotated[list[str] | None,
                    typer.Option(help="extra row NAME=SPEC, e.g. wide=static:width=4,depth=2")] = None,
    only: Annotated[list[str] | None,
                    typer.Option(help="run only these tree rows (repeatable; plain always runs)")] = None,
    no_hf: Annotated[bool, typer.Option("--no-hf", help="skip the HF assisted-generation row")] = False,
    hf_prompt_lookup: Annotated[int, typer.Option(
        help="add HF prompt lookup decoding with N candidate tokens (row hf_prompt_lookup; 0 = none)")]
        = _B.hf_prompt_lookup,
    compare: Annotated[list[str] | None, typer.Option(
        help="A:B compares row A's tokens/s with row B's prompt by prompt, with a 95% bootstrap interval "
             "(repeatable) [default: learned:learned_no_online]")] = None,
    batch_size: Annotated[list[int] | None, typer.Option(
        help="batched bench at these batch sizes (repeatable): tree rows via generate_batch against batched "
             "plain decoding (HF assisted generation has no batches)")] = None,
    pair: Annotated[str | None, typer.Option(help=PAIR_HELP, show_default=False)] = None,
    target: Annotated[str | None, typer.Option(help="target id or folder (default: the pair's)")] = None,
    draft: Annotated[str | None, typer.Option(help="draft id or folder (default: the pair's)")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the result as JSON")] = None,
    contend: Annotated[int, typer.Option(
        help="run N CPU-bound processes of the bench's own for the whole run (a busy machine)")] = 0,
    plot: Annotated[Path | None, typer.Option(
        help="with --batch-size: write speedup against batch size per row as a PNG")] = None,
) -> None:
    """Tokens/s and speedup of tree policies vs plain decoding vs HF assisted generation, side by side."""
    from treewise.decoder import TreewiseError

    from .contend import contention
    from .report import print_bench

    console = Console()

    with contention(contend):
        if batch_size:
            _bench_batched(suite, split, domain, per_domain, max_new_tokens, repeats, tree, batch_size,
                           (pair, target, draft), json_out, console, contend, plot)
            return
        compared = [_compared(item) for item in compare] if compare else _B.compare
        try:
            cfg = BenchConfig(suite=suite, split=split, domains=domain or None, per_domain=per_domain,
                              max_new_tokens=max_new_tokens, repeats=repeats, trees=_tree_rows(tree, only),
                              hf_assisted=not no_hf, hf_prompt_lookup=hf_prompt_lookup,
                              pair=pair, target=target, draft=draft, compare=compared)
            result = _run_solo(cfg, console)
        except TreewiseError as err:
            console.print(f"[red]error:[/red] {err}")
            raise typer.Exit(2) from None
        result.environment["contend"] = str(contend)
        print_bench(result, console)
        if json_out is not None:
            write_text(json_out, json.dumps(result.model_dump(mode="json"), indent=2), console)


def _tree_rows(tree: list[str] | None, only: list[str] | None) -> dict[str, list[str]]:
    """The bench's tree rows: the defaults, plus each --tree NAME=SPEC, cut to --only."""
    trees = dict(_B.trees)
    for item in tree or []:
        name, eq, spec = item.partition("=")
        if not eq:
            raise typer.BadParameter(f"--tree {item!r}: use NAME=SPEC")
        trees[name] = [spec]
    if only:
        unknown = sorted(set(only) - set(trees))
        if unknown:
            raise typer.BadParameter(f"--only {unknown}: rows are {sorted(trees)}")
        trees = {name: specs for name, specs in trees.items() if name in only}
    return trees


def _run_solo(cfg: BenchConfig, console: Console) -> BenchResult:
    """The interleaved bench of ``cfg`` under a progress bar (the real target fetched on first use)."""
    from treewise.studies.shared.measure import load_bench_decoder, select_prompts

    from .rows import run_bench

    prompts = select_prompts(cfg)
    open_pair(console, cfg.pair, cfg.target, cfg.draft)  # fetches the real target on first use, says what it borrows
    dec = load_bench_decoder(cfg)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("benchmark", total=len(prompts) * cfg.repeats)
        return run_bench(cfg, dec, on_progress=lambda: progress.advance(task))


def _bench_batched(suite: Path, split: str, domain: list[str] | None, per_domain: int, max_new_tokens: int,
                   repeats: int, tree: list[str] | None, sizes: list[int],
                   models: tuple[str | None, str | None, str | None], json_out: Path | None, console: Console,
                   contend: int = 0, plot: Path | None = None) -> None:
    pair, target, draft = models
    from treewise.decoder import TreewiseError
    from treewise.studies.shared.measure import load_bench_decoder, select_prompts

    from .batched import run_batch_bench
    from .report import plot_batch_bench, print_batch_bench

    specs = dict(_B.batch_trees)
    for item in tree or []:
        name, eq, spec = item.partition("=")
        if not eq:
            raise typer.BadParameter(f"--tree {item!r}: use NAME=SPEC")
        specs[name] = spec
    if min(sizes) < 1:
        raise typer.BadParameter(f"--batch-size must be >= 1, got {sorted(sizes)}")
    try:
        cfg = BenchConfig(suite=suite, split=split, domains=domain or None, per_domain=per_domain,
                          max_new_tokens=max_new_tokens, repeats=repeats, pair=pair, target=target, draft=draft)
        prompts = select_prompts(cfg)
        open_pair(console, pair, target, draft)
        dec = load_bench_decoder(cfg)
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("batched benchmark", total=repeats * sum(-(-len(prompts) // b) for b in sizes))
            result = run_batch_bench(dec, prompts, sorted(set(sizes)), specs, max_new_tokens, repeats,
                                     on_progress=lambda: progress.advance(task), pair=pair,
                                     continuous=dict(_B.batch_continuous))
    except TreewiseError as err:
        console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None
    result.environment["contend"] = str(contend)
    print_batch_bench(result, console)
    if json_out is not None:
        write_text(json_out, json.dumps(result.model_dump(mode="json"), indent=2), console)
    if plot is not None:
        console.print(f"wrote {plot_batch_bench(result, plot)}")


def decode(
    prompt: Annotated[str, typer.Argument(help="the prompt text")],
    tree: Annotated[str | None, typer.Option(
        help="tree spec [default: static with the width and depth of the decoder's DecodeConfig]")] = None,
    policy: Annotated[str | None, typer.Option(
        help="a policy by name with its defaults: learned, budgeted, confidence, dynamic_chain, chain "
             "(overrides --tree)",
    )] = None,
    max_new_tokens: int = typer.Option(default_factory=lambda: _decode_defaults().max_new_tokens,
                                       show_default=_FROM_DECODER),
    temperature: float = typer.Option(default_factory=lambda: _decode_defaults().temperature,
                                      show_default=_FROM_DECODER, help="0 = greedy"),
    seed: Annotated[int | None, typer.Option()] = None,
    domain: Annotated[str, typer.Option()] = "unknown",
    pair: Annotated[str | None, typer.Option(help=PAIR_HELP, show_default=False)] = None,
    target: Annotated[str | None, typer.Option(help="target id or folder (default: the pair's)")] = None,
    draft: Annotated[str | None, typer.Option(help="draft id or folder (default: the pair's)")] = None,
) -> None:
    """Decode one prompt (a chat pair frames it as a user turn), streaming the text, then the step statistics."""
    from treewise.decoder import TreewiseError
    from treewise.studies.shared.pairs import load_pair_decoder
    from treewise.studies.shared.treespec import build_tree

    from .report import step_table

    console = Console()
    spec = _policy_spec(policy) if policy is not None else tree if tree is not None else _policy_spec("static")
    try:
        tree_policy = build_tree(spec, pair)
        dec = load_pair_decoder(open_pair(console, pair, target, draft))
        shown: list[int] = []

        def show(tokens: list[int]) -> None:
            before = dec.tokenizer.decode(shown, skip_special_tokens=True)
            shown.extend(tokens)
            console.print(dec.tokenizer.decode(shown, skip_special_tokens=True)[len(before):], end="",
                          markup=False, highlight=False)

        out = dec.generate(prompt, max_new_tokens, tree=tree_policy, temperature=temperature, seed=seed,
                           domain=domain, stream=show)
    except TreewiseError as err:
        console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None
    console.print()
    console.print(step_table(out.stats))
    console.print(f"finish: {out.finish_reason}")


def latency(
    out: Annotated[Path | None, typer.Option(
        help="where to write the profile", show_default="the pair's latency.json: data/latency.json (micro), "
                                                        "data/smollm2/latency.json (smollm2)")] = None,
    pair: Annotated[str | None, typer.Option(help=PAIR_HELP, show_default=False)] = None,
    target: Annotated[str | None, typer.Option(help="target id or folder (default: the pair's)")] = None,
    draft: Annotated[str | None, typer.Option(help="draft id or folder (default: the pair's)")] = None,
    context: Annotated[int, typer.Option(help="cached tokens under each timed forward")] = 128,
    linears_ab: Annotated[bool, typer.Option(
        "--linears-ab", help="instead: time the target with torch's nn.Linear and with the decoder's SkinnyLinear "
                             "(decoder/kernels/linears.py) in turns, and print both; writes nothing")] = False,
    decode: Annotated[int, typer.Option(
        help="with --linears-ab: also decode N test prompts per domain (tree spec learned, 64 tokens) with each "
             "kind, alternating")] = 0,
    batch: Annotated[bool, typer.Option(
        help="also measure the batch grid (rows x tokens per row, the batched cost model)")] = True,
    batch_only: Annotated[bool, typer.Option(
        "--batch-only", help="keep the solo curves of the profile at --out; measure only its batch grid")] = False,
) -> None:
    """Measure the pair's forward latency by tree size and batch (LearnedTree's cost model); write it as JSON."""
    from treewise.controller import LatencyProfile, measure_latency
    from treewise.controller.latency import measure_batch_grid
    from treewise.controller.pairs import LATENCY, pair_spec
    from treewise.decoder import TreewiseError
    from treewise.studies.shared.pairs import load_pair_decoder

    console = Console()
    try:
        out = out or pair_spec(pair).own(LATENCY)
        dec = load_pair_decoder(open_pair(console, pair, target, draft, files=False))
    except TreewiseError as err:
        console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None
    if linears_ab:
        _linears_ab(dec, context, decode, pair, console)
        return
    try:
        profile = LatencyProfile.read(out) if batch_only else measure_latency(dec.target, dec.draft, context=context)
    except TreewiseError as err:
        console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None
    if batch or batch_only:
        profile = measure_batch_grid(dec, profile)
    write_text(out, json.dumps(profile.model_dump(), indent=1))
    from .report import curve_table

    console.print(curve_table(profile, f"forward latency, ms (context {context}, {profile.threads} threads, "
                                       f"{profile.device})"))
    console.print("target: verifying a tree of that many nodes; draft: one drafting level of that many nodes")
    if profile.batch_rows:
        console.print(_grid_table(profile))
    console.print(f"wrote {out}")


def _linears_ab(dec: TreeDecoder, context: int, decode: int, pair: str | None, console: Console) -> None:
    """`treewise latency --linears-ab`: nn.Linear against SkinnyLinear, forwards and (``decode`` > 0) decodes."""
    from .linears import linears_table, measure_linears

    console.print(linears_table(measure_linears(dec.target, context)))
    if decode <= 0:
        return
    from treewise.studies.shared.measure import select_prompts

    from .linears import measure_linears_decode

    prompts = select_prompts(BenchConfig(split="test", per_domain=decode, pair=pair))
    ab = measure_linears_decode(dec, [p.prompt for p in prompts], "learned", 64, pair)
    console.print(f"decodes ({ab.prompts} prompts, {ab.max_new_tokens} tokens, {ab.tree}): nn.Linear "
                  f"{ab.stock_tokens_per_s:.1f} tok/s, SkinnyLinear {ab.skinny_tokens_per_s:.1f} tok/s; "
                  f"per prompt nn.Linear time / SkinnyLinear time: median {ab.ratio_median:.3f} "
                  f"(range {ab.ratio_range[0]:.2f}-{ab.ratio_range[1]:.2f}); {ab.mismatches} outputs differ")


def _grid_table(profile: LatencyProfile) -> Table:
    table = Table(title="batched forward, ms (target / draft): rows x tokens fed by each row")
    table.add_column("rows", justify="right")
    for n in profile.batch_sizes:
        table.add_column(f"{n} tok", justify="right")
    for b, ts, ds in zip(profile.batch_rows, profile.batch_target_ms, profile.batch_draft_ms, strict=True):
        table.add_row(str(b), *(f"{t:.1f} / {d:.1f}" for t, d in zip(ts, ds, strict=True)))
    return table


def register(app: typer.Typer) -> None:
    app.command()(bench)
    app.command()(decode)
    app.command()(latency)
    app.command()(sweep)
