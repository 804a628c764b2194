"""`python -m gptforge.bench.readme_numbers`: every stated figure is on its page in the words the claim gives,
the page's command is the one the script runs, a figure outside its range fails the run, and (lane) every
journey runs shrunk end to end."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from gptforge.bench import readme_numbers as rn

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("claim", rn.CLAIMS, ids=lambda c: c.name)
def test_every_claim_is_stated_on_its_page_in_its_words(claim):
    page = ROOT / claim.page
    assert page.is_file(), f"{claim.name}: {claim.page} does not exist"
    assert claim.stated in page.read_text(), f"{claim.page} no longer says {claim.stated!r} ({claim.name})"
    assert claim.lo <= claim.hi and claim.journey in rn.JOURNEYS


def _doc_commands(page: Path, sub: str) -> list[list[str]]:
    """The `gptforge SUB ...` commands in the page's code blocks, continuations joined, as argv lists."""
    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S)
    text = re.sub(r"\\\n\s*", " ", "\n".join(blocks))
    out = []
    for line in text.splitlines():
        m = re.match(rf"\s*gptforge {sub}\b(.*)$", line)
        if m:
            out.append(shlex.split(m.group(1), comments=True))
    return out


def _pairs(argv: list[str]) -> set[tuple[str, str]]:
    return {(a, b) for a, b in zip(argv, argv[1:], strict=False) if a.startswith("--") and not b.startswith("--")}


@pytest.mark.parametrize("journey,sub,flags", [("chat", "sft", rn.CHAT_SFT), ("chat", "rl", rn.CHAT_RL),
                                               ("smollm2", "sft", rn.SMOL_SFT), ("smollm2", "dpo", rn.SMOL_DPO)])
def test_each_guide_shows_the_commands_the_script_runs(journey, sub, flags):
    """A journey's figures are made by its flag lists (CHAT_SFT, SMOL_DPO, ...): the guide's `sft`, `rl` or `dpo`
    command carries every one of those flags with the same value (a guide that drifted from the measured
    recipe fails here)."""
    page = ROOT / next(c.page for c in rn.CLAIMS if c.journey == journey)
    want = _pairs(flags)
    shown = [_pairs(argv) for argv in _doc_commands(page, sub)]
    assert shown, f"{page.name}: no `gptforge {sub}` command"
    assert any(want <= got for got in shown), f"{page.name}: no `gptforge {sub}` with {sorted(want - shown[0])}"


def _fake(values: dict):
    return {name: (lambda ctx, v=v: dict(v)) for name, v in values.items()}


def test_a_figure_outside_its_range_fails_the_run_and_every_seed_is_judged(monkeypatch, tmp_path, capsys):
    lo = {c.name: c.lo for c in rn.CLAIMS}
    inside = {"default_job": {"val_loss": lo["default_job.val_loss"]},  # the ends are inside
              "chat": {"per_seed": {1: {"sft_compare": 99.0, "rl_compare": 99.0},
                                    2: {"sft_compare": lo["chat.sft_compare"], "rl_compare": 99.5}}},
              "plan": {"llama3_1b_full": 22.87, "llama3_1b_lora": 13.52}}
    monkeypatch.setattr(rn, "JOURNEYS", _fake(inside))
    monkeypatch.setattr(rn, "CLAIMS", [c for c in rn.CLAIMS if c.journey in inside])
    assert rn.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "OUT" not in out and f"seed 2: {lo['chat.sft_compare']:.4g}" in out
    # one seed of five below the SFT claim: the run fails and names it
    low = lo["chat.sft_compare"] - 0.1
    bad = dict(inside, chat={"per_seed": {s: {"sft_compare": 99.0 if s != 4 else low, "rl_compare": 99.0}
                                          for s in range(1, 6)}})
    monkeypatch.setattr(rn, "JOURNEYS", _fake(bad))
    assert rn.main(["--out", str(tmp_path)]) == 1
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "chat.sft_compare" in ln)
    assert line.startswith("OUT") and f"seed 4: {low:.4g}" in line
    # a figure above its range fails too (a claim is a range, not a floor)
    monkeypatch.setattr(rn, "JOURNEYS", _fake(dict(inside, plan={"llama3_1b_full": 22.88, "llama3_1b_lora": 13.52})))
    assert rn.main(["--out", str(tmp_path), "--only", "plan"]) == 1
    # --shrunk reads the figures back without judging them
    assert rn.main(["--out", str(tmp_path), "--only", "plan", "--shrunk"]) == 0


def test_unknown_journeys_and_bad_seeds_are_one_line(tmp_path, capsys):
    for argv, words in ((["--only", "chat,nope"], "unknown journey nope"), (["--seeds", "1,x"], "--seeds: '1,x'")):
        with pytest.raises(SystemExit) as e:
            rn.main([*argv, "--out", str(tmp_path)])
        assert e.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.lane
@pytest.mark.smollm
def test_every_journey_runs_shrunk(tmp_path):
    """The documented commands of every journey, with tiny step counts: each runs and each figure is read back."""
    assert rn.main(["--out", str(tmp_path), "--shrunk", "--seeds", "1"]) == 0
    import json

    got = json.loads((tmp_path / "measured.json").read_text())
    assert set(got) == set(rn.JOURNEYS)
    for c in rn.CLAIMS:
        m = got[c.journey]
        key = c.name.split(".", 1)[1]
        vals = [f[key] for f in m["per_seed"].values()] if "per_seed" in m else [m[key]]
        assert all(isinstance(v, float | int) for v in vals), c.name
