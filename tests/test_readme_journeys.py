"""The README's chat and preference journeys, run as written but shrunk (slow lane): every command of
the two code blocks, in order, in a scratch directory, from a tiny base model standing in for the
default job's ``runs/shakespeare-cpu``. Sizes (steps, problems, pairs, replies) are cut to seconds;
flags, paths and the order of the commands are the README's own, so a journey step that stops working
(a renamed flag, a path one step writes and the next cannot read) fails here.

Interactive commands (``chat``, ``serve``) and the ensemble line (it names three reward models the
block does not make) are left out; on-policy pairs from a 2-step policy may be refused with "no pairs"
(every reply equally wrong), which is the command's own answer for such a model.
"""

from __future__ import annotations

import re
import shlex

import pytest

from gptforge.cli import main
from tests.conftest import tiny_chat_checkpoint
from tests.test_docs import README, _command_lines

pytestmark = pytest.mark.slow

SHRINK = [(r"--n \d+", "--n 24"), (r"--train\.max_steps \d+", "--train.max_steps 2"), (r"--steps \d+", "--steps 1"),
          (r"--limit \d+", "--limit 3"), (r"--prompts \d+", "--prompts 2"), (r"--group \d+", "--group 2"),
          (r"--max-new-tokens \d+", "--max-new-tokens 4"), (r"--train\.ckpt_every \d+", "--train.ckpt_every 1"),
          (r"--warmup-steps \d+", "--warmup-steps 0"), (r"step_000\d+", "step_000002")]
EXTRA = {"sft": "--val-count 8", "rm": "--val-count 8 --micro-batch 4", "dpo": "--val-count 8 --micro-batch 4 --eval-n 4",
         "rl": "--steps 1 --prompts 2 --group 2 --max-new-tokens 4 --eval-n 4",
         "prepare": "--samples 2 --max-new-tokens 4"}


def _block(heading: str) -> list[str]:
    text = README.read_text()
    after = text[text.index(heading):]
    return _command_lines(re.search(r"```bash\n(.*?)```", after, flags=re.S).group(1))


def _shrunk(cmd: str) -> list[str]:
    for pattern, small in SHRINK:
        cmd = re.sub(pattern, small, cmd)
    verb = cmd.split()[0]
    extra = EXTRA.get(verb, "")
    if verb == "prepare" and "--policy" not in cmd:
        extra = ""
    return shlex.split(cmd) + shlex.split(extra)


def _run(commands: list[str], capsys) -> None:
    for cmd in commands:
        if cmd.split()[0] in ("chat", "serve") or "runs/rm1," in cmd:
            continue
        argv = _shrunk(cmd)
        rc = main(argv)
        out, err = capsys.readouterr()
        if rc == 2 and "--policy" in cmd and "no pairs" in err:
            continue  # a 2-step policy is right or wrong alike on every problem: the refusal says so
        assert rc == 0, f"README command failed ({rc}): gptforge {cmd}\nshrunk: {argv}\n{err[-2000:]}"
        assert "Traceback" not in out + err, cmd


def test_readme_chat_and_preference_journeys_run_shrunk(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    tiny_chat_checkpoint(tmp_path / "runs" / "shakespeare-cpu", chat=False)  # the default job's model, tiny
    chat = _block("## Chat: fine-tuning (SFT)")
    prefs = _block("## Preferences: reward models, DPO and PPO")
    assert any(c.startswith("sft ") for c in chat) and any(c.startswith("rm ") for c in prefs)
    _run(chat, capsys)
    assert (tmp_path / "runs" / "rl" / "metrics.jsonl").exists()
    _run(prefs, capsys)
    assert (tmp_path / "runs" / "grpo_rm" / "metrics.jsonl").exists()
