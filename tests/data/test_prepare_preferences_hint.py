"""``prepare preferences`` ends with what to do next, naming both recipes that train on pairs (issue 55: it
hinted only ``rm``, not ``dpo``). Each hinted command is parsed by the real parser, so it cannot drift."""

from __future__ import annotations

import re
import shlex

from gptforge.cli import build_parser, main
from gptforge.cli.data import preference_hint


def _commands(line: str) -> list[list[str]]:
    return [shlex.split(m) for m in re.findall(r"gptforge ((?:dpo|rm|eval) [^()`;,]+?)(?= \(|;|$|\))", line)]


def test_prepare_preferences_names_dpo_and_rm(tmp_path, capsys):
    out = tmp_path / "pairs.jsonl"
    assert main(["prepare", "preferences", "compare", "--n", "4", "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    cmds = _commands(line)
    assert sorted(c[0] for c in cmds) == ["dpo", "rm"], line
    for c in cmds:
        args = build_parser(c).parse_args(c)
        assert args.data == str(out) and args.init_from == "RUN", c


def test_held_out_pairs_are_scored_not_trained_on(tmp_path):
    cmds = _commands(preference_hint(tmp_path / "held.jsonl", "RUN", held_out=True))
    assert [c[0] for c in cmds] == ["eval"] and build_parser(cmds[0]).parse_args(cmds[0]).preferences == \
        str(tmp_path / "held.jsonl")


def test_an_on_policy_file_names_its_policy(tmp_path):
    cmds = _commands(preference_hint(tmp_path / "p.jsonl", "runs/sft"))
    assert {c[0]: build_parser(c).parse_args(c).init_from for c in cmds} == {"dpo": "runs/sft", "rm": "runs/sft"}
