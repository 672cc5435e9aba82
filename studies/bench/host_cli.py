"""`treewise host`: the host this runs on and the cost curve the policies price trees by here (imports no torch)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from treewise.studies.shared.commands import open_pair
from treewise.studies.shared.paths import PAIR_HELP


def host(
    pair: Annotated[str | None, typer.Option(help=PAIR_HELP, show_default=False)] = None,
    target: Annotated[str | None, typer.Option(help="target id or folder (default: the pair's)")] = None,
    draft: Annotated[str | None, typer.Option(help="draft id or folder (default: the pair's)")] = None,
    remeasure: Annotated[bool, typer.Option("--remeasure", help="measure this host's curve again (e.g. after a "
                                                                 "noisy first probe) and cache it")] = False,
) -> None:
    """This host (CPU model, ISA flags, threads) and the pair's cost curve here: shipped, cached or measured."""
    from treewise.decoder import TreewiseError
    from treewise.studies.shared.pairs import host_curve, load_pair_decoder

    from .report import curve_table

    console = Console()
    try:
        resolved = open_pair(console, pair, target, draft, files=False)
        dec = load_pair_decoder(resolved)
        found = host_curve(dec, resolved, remeasure=remeasure)
    except TreewiseError as err:
        console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None
    console.print(found.line(), markup=False, highlight=False)
    profile = found.profile
    console.print(curve_table(profile, f"{resolved.name}: forward ms by new tokens (context {profile.context}, "
                                       f"{profile.threads} threads, {profile.device})"))


def register(app: typer.Typer) -> None:
    app.command()(host)
