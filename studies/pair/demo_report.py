"""`treewise demo`'s printout: each prompt's generated text, then tau, tokens/s and speedup per domain."""

from __future__ import annotations

import textwrap

from rich.console import Console
from rich.table import Table

from .demo import DemoResult, DemoRow


def print_demo(result: DemoResult, console: Console, show_text: bool = True) -> None:
    console.print(f"[bold]treewise demo[/]: {result.pair} pair, target {result.target_params / 1e6:.1f}M parameters, "
                  f"draft {result.draft_params / 1e6:.1f}M, {result.tree}, {result.max_new_tokens} new tokens"
                  + (", prompts framed by the chat template" if result.chat else "")
                  + (", precision fast (bfloat16, against plain bf16 greedy)" if result.precision == "fast" else ""))
    if result.host:
        console.print(result.host, markup=False, highlight=False)
    if show_text:
        for r in result.rows:
            mark = "[green]same as target greedy[/]" if r.same_as_plain else "[red]DIFFERS from target greedy[/]"
            console.print(f"\n[bold]{r.domain}[/] {r.prompt_id}: tau {r.tau:.2f}, {r.speedup:.2f}x, {mark}")
            body = textwrap.indent(textwrap.fill(" ".join(r.text.split()) or "(no text)", width=100), "  ")
            console.print(body, markup=False, highlight=False)
        console.print()
    console.print(domain_table(result.rows))
    console.print(summary_line(result.rows))


def domain_table(rows: list[DemoRow]) -> Table:
    table = Table(title="tree vs the target's own greedy decoding (model.generate), per domain")
    for name in ("domain", "prompts", "new tokens", "tau", "tok/s", "plain tok/s", "speedup", "identical"):
        table.add_column(name, justify="left" if name == "domain" else "right")
    for domain in dict.fromkeys(r.domain for r in rows):
        mine = [r for r in rows if r.domain == domain]
        tokens, tree_s, plain_s = _totals(mine)
        table.add_row(domain, str(len(mine)), str(tokens), f"{sum(r.tau for r in mine) / len(mine):.2f}",
                      f"{tokens / tree_s:.1f}", f"{tokens / plain_s:.1f}", f"{plain_s / tree_s:.2f}x",
                      f"{sum(r.same_as_plain for r in mine)}/{len(mine)}")
    return table


def summary_line(rows: list[DemoRow]) -> str:
    tokens, tree_s, plain_s = _totals(rows)
    same = sum(r.same_as_plain for r in rows)
    line = (f"all: {tokens} tokens, mean tau {sum(r.tau for r in rows) / len(rows):.2f}, tree {tokens / tree_s:.1f} "
            f"tok/s vs plain {tokens / plain_s:.1f} tok/s ({plain_s / tree_s:.2f}x); tree output identical to the "
            f"target's greedy output in {same}/{len(rows)} prompts")
    return line if same == len(rows) else f"[red]{line}[/]"


def _totals(rows: list[DemoRow]) -> tuple[int, float, float]:
    """New tokens and the seconds the tree and plain decoding took for them (from each row's tokens/s)."""
    tokens = sum(r.new_tokens for r in rows)
    tree_s = sum(r.new_tokens / r.tokens_per_s for r in rows if r.tokens_per_s) or float("inf")
    plain_s = sum(r.new_tokens / r.plain_tokens_per_s for r in rows if r.plain_tokens_per_s) or float("inf")
    return tokens, tree_s, plain_s
