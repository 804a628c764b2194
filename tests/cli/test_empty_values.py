"""An empty value ('') names nothing, and is refused as such wherever it is not a setting of its own: walked over
every option and positional of every command and tool, and every ``--section.key`` override. Before, '' was the
current folder (`prepare files ''` read it whole, `train --data.dir ''` listed it), turned a guard off (`serve
--api-key ''` served without a key), or reached a traceback (`prepare files a.txt --out ''`). A refused command
leaves no folder behind: neither a lock file in a folder that holds no shards nor an empty ``runs/`` above the
run directory it did not keep."""

from __future__ import annotations

import argparse
import os

import pytest

from gptforge.argparsing import EMPTY_MEANS_SOMETHING
from gptforge.cli import build_parser, main
from tests.cli.test_inputs_round12 import _parsers, _tool_parsers, config_keys_of


def _code(argv: list[str]) -> int:
    """main's exit status, returned or raised (argparse's refusals exit from inside the parser)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def _valued(action: argparse.Action) -> bool:
    """Whether the action takes words (not a switch, --help, or a command's own parser)."""
    return action.nargs != 0 and action.nargs not in (argparse.PARSER, argparse.REMAINDER) \
        and not isinstance(action, argparse._SubParsersAction | argparse._HelpAction | argparse._VersionAction)


def test_every_option_and_positional_of_every_command_and_tool_refuses_an_empty_value(monkeypatch):
    walked, took = [], []
    for root in [build_parser()] + _tool_parsers(monkeypatch):
        for path, p in _parsers(root):
            for action in p._actions:
                if not _valued(action):
                    continue
                name = "/".join(action.option_strings) or action.metavar or action.dest
                if action.dest in EMPTY_MEANS_SOMETHING:
                    p._get_values(action, [""])  # an empty prompt, no system prompt: taken
                    took.append(name)
                    continue
                walked.append((path, name))
                with pytest.raises(argparse.ArgumentError) as e:
                    p._get_values(action, [""])
                said = str(e.value)
                assert name in said and "'' is empty" in said and "\n" not in said, (path, said)
    names = {n for _, n in walked}
    # the walk reached the paths, the outputs, the keys and the positionals
    assert {"--out", "--ckpt", "--data", "--api-key", "--init-from", "--resume", "--tokenizer", "PATH"} <= names, names
    assert len(walked) > 150 and set(took) == {"--prompt", "--system"}, (len(walked), took)


@pytest.mark.parametrize("argv", [["prepare", "files", ""], ["prepare", "files", "a.txt", "--out", ""],
                                  ["prepare", "shakespeare", "--out="], ["serve", "--random", "d2", "--api-key", ""],
                                  ["train", "--resume", ""], ["sample", "--ckpt", ""]])
def test_through_the_command_it_is_one_line_before_any_work(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("hello there\n")
    assert _code(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "'' is empty" in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]  # nothing read into shards, nothing written


def test_an_empty_prompt_is_still_a_prompt(capsys):
    assert main(["sample", "--random", "d2", "--prompt", "", "--max-new-tokens", "2", "--seed", "1"]) == 0


def _config_str_keys() -> dict:
    return {key: cfg for key, (_, cfg) in config_keys_of((str,)).items()}


def test_every_text_config_key_refuses_an_empty_value_unless_empty_is_its_default():
    import dataclasses

    from gptforge.config import ConfigError, apply_overrides

    keys = _config_str_keys()
    assert {"data.dir", "train.out_dir", "data.train_split"} <= set(keys), sorted(keys)
    refused = 0
    for key, cfg in keys.items():
        section, name = key.split(".", 1)
        default = next(f.default for f in dataclasses.fields(getattr(cfg, section)) if f.name == name)
        if key == "model.arch":  # the family, chosen first, refuses '' by naming the families
            with pytest.raises(ConfigError, match="model.arch='' is not a known model family"):
                apply_overrides(cfg, [f"--{key}="])
            continue
        if default == "":  # train.log_to '' sends metrics nowhere else: a setting
            apply_overrides(cfg, [f"--{key}", ""])
            continue
        with pytest.raises(ConfigError, match=rf"^--{key} '' is empty; it names no file, folder or value"):
            apply_overrides(cfg, [f"--{key}="])
        refused += 1
    assert refused >= 10, refused


def test_a_folder_without_shards_is_refused_without_a_lock_file_left_in_it(tmp_path):
    from gptforge.data.shards import SHARD_LOCK_NAME, ShardError, list_shards

    (tmp_path / "notes.txt").write_text("not shards")
    with pytest.raises(ShardError, match="no 'train' shards"):
        list_shards(tmp_path, "train", "val")
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]
    assert not (tmp_path / SHARD_LOCK_NAME).exists()


def test_a_refused_run_leaves_no_folder_it_made_above_its_run_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "keep").mkdir()
    for out in ("runs/a/b", "keep/x/y"):
        assert main(["train", "--data.dir", "empty", "--out", out]) == 2
    assert sorted(os.listdir(tmp_path)) == ["empty", "keep"] and os.listdir(tmp_path / "keep") == []
    assert os.listdir(tmp_path / "empty") == []
