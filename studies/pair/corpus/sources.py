"""The offline sources read raw: installed texts (fortunes, the KJV Bible, chatterbot) and the stable hash
that reserves a prompt pool. Both the corpus (``build``) and the generators read these, one way.

Install commands for each source are in ``build``'s docstring and data/models/README.md.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path


class SourceMissing(RuntimeError):
    """An offline source is not installed; the message names the install command."""


def stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def is_prompt_pool(key: str) -> bool:
    """Items reserved for prompts (1 in 8 by stable hash); the corpus never uses them."""
    return stable_hash("pool:" + key) % 8 == 0


def require(path: Path, package: str) -> Path:
    if not path.exists():
        raise SourceMissing(f"{path} missing: run `apt-get install -y {package}`")
    return path


def bible_verses() -> list[str]:
    try:
        out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True)
    except (FileNotFoundError, subprocess.CalledProcessError) as err:
        raise SourceMissing(f"`bible` failed ({err}): run `apt-get install -y bible-kjv bible-kjv-text`") from None
    return [v for v in out.stdout.splitlines() if v.strip()]


def fortunes() -> list[str]:
    root = require(Path("/usr/share/games/fortunes"), "fortunes")
    items: list[str] = []
    for path in sorted(root.iterdir()):
        if path.suffix or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        items += [f.strip("\n") for f in text.split("\n%\n") if 20 < len(f.strip()) < 1500]
    return items


def chatterbot_conversations() -> list[list[str]]:
    """All english chatterbot conversations (lists of turns), prompt pool included."""
    try:
        import chatterbot_corpus
        import yaml
    except ImportError:
        raise SourceMissing("chatterbot-corpus missing: run `pip install -e '.[data]'`") from None
    root = Path(chatterbot_corpus.__file__).parent / "data" / "english"
    convs: list[list[str]] = []
    for path in sorted(root.glob("*.yml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for conv in data.get("conversations", []):
            turns = [str(t).strip() for t in conv if str(t).strip()]
            if len(turns) >= 2:
                convs.append(turns)
    return convs
