"""`--pair`: names resolve to folders (the real target fetched, a missing draft named before any fetch), a chat
pair's decoder frames prompts by the chat template and the micro pair's does not, `treewise demo --json` and
`treewise latency --pair` write what they say."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import write_suite
from transformers import AutoTokenizer
from typer.testing import CliRunner

from treewise.controller.pairs import PAIRS
from treewise.decoder import TreewiseError
from treewise.decoder.chat import chat_ids
from treewise.studies.cli import app
from treewise.studies.shared import pairs as shared_pairs
from treewise.studies.shared.pairs import load_pair_decoder, resolve_pair
from treewise.studies.shared.paths import PAIR_HELP, PAIR_NAMES

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}" \
           "{% if add_generation_prompt %}<assistant>{% endif %}"


@pytest.fixture(scope="module")
def chat_pair_dir(tiny_pair_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny pair with a chat template in both tokenizers, as the real pair's folders have."""
    root = tmp_path_factory.mktemp("chatpair")
    for role in ("target", "draft"):
        shutil.copytree(tiny_pair_dir / role, root / role)
        tok = AutoTokenizer.from_pretrained(root / role)
        tok.chat_template = TEMPLATE
        tok.save_pretrained(root / role)
    return root


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty data folder (no shipped models), and a fetch that fails the test if anything calls it."""
    monkeypatch.setenv("TREEWISE_DATA", str(tmp_path))

    def no_fetch(*_a: object, **_k: object) -> Path:
        raise AssertionError("fetched the real target")

    monkeypatch.setattr(shared_pairs, "fetch", no_fetch)
    return tmp_path


def test_the_clis_pair_names_are_the_registrys() -> None:
    assert PAIR_NAMES == tuple(PAIRS) and all(name in PAIR_HELP for name in PAIRS)


def test_micro_resolves_to_the_embedded_folders(data: Path) -> None:
    for role in ("target", "draft"):
        (data / "models" / role).mkdir(parents=True)
    pair = resolve_pair("micro")
    assert (pair.name, pair.target, pair.draft, pair.chat) == ("micro", str(data / "models" / "target"),
                                                               str(data / "models" / "draft"), False)
    assert pair.files.latency == data / "latency.json" and pair.files.borrowed == ()


def test_a_missing_draft_is_named_before_the_target_is_fetched(data: Path) -> None:
    with pytest.raises(TreewiseError, match=r"the smollm2 pair has no draft at .*smollm2-draft: run `treewise pair "
                                            r"train-draft`"):
        resolve_pair("smollm2")
    res = CliRunner().invoke(app, ["decode", "hi", "--pair", "smollm2"])
    assert res.exit_code == 2 and "treewise pair train-draft" in " ".join(res.output.split())
    with pytest.raises(TreewiseError, match="no model pair under .*treewise train-pair"):
        resolve_pair("micro")


def test_smollm2_fetches_its_target_once_resolved(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (data / "models" / "smollm2-draft").mkdir(parents=True)
    calls: list[str] = []

    def fake_fetch(source: object, on_stage: object = None) -> Path:
        calls.append(source.name)  # type: ignore[attr-defined]
        return data / "cache" / "target"

    monkeypatch.setattr(shared_pairs, "fetch", fake_fetch)
    pair = resolve_pair("smollm2")
    assert (pair.target, pair.draft, pair.chat, calls) == (str(data / "cache" / "target"),
                                                           str(data / "models" / "smollm2-draft"), True, ["smollm2"])
    assert resolve_pair("smollm2", target="elsewhere").target == "elsewhere" and calls == ["smollm2"]  # no fetch
    assert [n.split(":")[0] for n in pair.files.borrowed] == ["latency.json", "budgets.json", "predictor"]


def test_chat_framing_for_the_chat_pair_and_not_for_micro(chat_pair_dir: Path, data: Path) -> None:
    target, draft = chat_pair_dir / "target", chat_pair_dir / "draft"
    chat = load_pair_decoder(resolve_pair("smollm2", target, draft))
    plain = load_pair_decoder(resolve_pair("micro", target, draft))
    framed = chat_ids(chat.tokenizer, "code prompt 0:")
    assert chat.generate("code prompt 0:", max_new_tokens=3).prompt_ids == framed
    assert chat.generate_plain("code prompt 0:", max_new_tokens=3).prompt_ids == framed
    assert plain.generate("code prompt 0:", max_new_tokens=3).prompt_ids == plain.tokenizer("code prompt 0:").input_ids
    assert plain.tokenizer("code prompt 0:").input_ids != framed


def test_demo_json_on_the_micro_pair(tiny_pair_dir: Path, data: Path) -> None:
    write_suite(data).rename(data / "prompts")
    out = data / "demo.json"
    res = CliRunner().invoke(app, ["demo", "--pair", "micro", "--target", str(tiny_pair_dir / "target"), "--draft",
                                   str(tiny_pair_dir / "draft"), "--per-domain", "1", "--max-new-tokens", "6",
                                   "--threads", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    got = json.loads(out.read_text())
    assert (got["pair"], got["chat"], got["tree"], got["max_new_tokens"]) == ("micro", False, "static:width=2,depth=3",
                                                                              6)
    assert got["target_params"] > got["draft_params"] > 0 and got["target"] == str(tiny_pair_dir / "target")
    assert [r["domain"] for r in got["rows"]] == ["code", "dialogue"]
    for row in got["rows"]:
        assert row["same_as_plain"] is True and row["new_tokens"] == 6 and row["tau"] >= 1
        assert row["speedup"] == pytest.approx(row["tokens_per_s"] / row["plain_tokens_per_s"])
        assert isinstance(row["text"], str)
    assert "identical to the target's greedy output in 2/2 prompts" in " ".join(res.output.split())
    assert got["host"].startswith("host: ") and "cost curve" in got["host"]  # priced by this host's curve


def test_host_prints_this_host_and_the_pairs_curve_here(tiny_pair_dir: Path, data: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TREEWISE_CACHE", str(data / "cache"))
    args = ["host", "--pair", "micro", "--target", str(tiny_pair_dir / "target"), "--draft",
            str(tiny_pair_dir / "draft")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert flat.startswith("host: ") and "forward ms by new tokens" in flat
    assert any(f"cost curve {s}" in flat for s in ("measured", "fallback"))  # a noisy probe falls back, and says so
    again = CliRunner().invoke(app, [*args, "--remeasure"])
    assert again.exit_code == 0 and "cost curve cached" not in again.output


def test_demo_on_a_chat_pair_frames_its_prompts(chat_pair_dir: Path, data: Path) -> None:
    from treewise.studies.pair.config import DemoConfig
    from treewise.studies.pair.demo import run_pair_demo

    write_suite(data).rename(data / "prompts")
    cfg = DemoConfig(per_domain=1, max_new_tokens=4, threads=1, tree="static:width=2,depth=2")  # data/ is empty
    chat = run_pair_demo(cfg, resolve_pair("smollm2", chat_pair_dir / "target", chat_pair_dir / "draft"))
    assert chat.chat and chat.pair == "smollm2" and all(r.same_as_plain for r in chat.rows)
    assert len(chat.borrowed) == 3  # the real pair's data files are the micro pair's until its own exist


def test_latency_writes_the_pairs_own_profile(tiny_pair_dir: Path, data: Path) -> None:
    res = CliRunner().invoke(app, ["latency", "--pair", "smollm2", "--context", "8", "--target",
                                   str(tiny_pair_dir / "target"), "--draft", str(tiny_pair_dir / "draft")])
    assert res.exit_code == 0, res.output
    assert (data / "smollm2" / "latency.json").is_file() and not (data / "latency.json").exists()
