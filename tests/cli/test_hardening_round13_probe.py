"""Hardening round thirteen, careless and hostile use in classes earlier rounds did not test.

* ``train --resume --optim.weight_decay 0.5`` (beta1, beta2, eps; optim.embed_lr and muon_lr through their groups'
  base_lr; Muon's momentum, nesterov, ns_steps, weight decay) was dropped in silence: torch's
  Optimizer.load_state_dict takes every group's settings from optimizer.pt, so the run trained on with the saved
  ones while its config.json and its next checkpoint recorded the new ones. run/checkpointer.py's restore, every
  recipe's one resume (plain, ZeRO, FSDP, DCP alike), puts this run's config's settings back over the loaded
  state (run/restore.py's keep_settings); what a checkpoint carries is the state (moments, step counts).
* A checkpoint whose optimizer state is not finite (a NaN or inf moment: damage, a hand-made file) loaded without
  a word, trained one step, then "diverged", advising a lower lr and ``--resume``, which read the same state
  again. run/restore.py's load_optimizer, the one reader of optimizer.pt, refuses it naming the file, the
  parameter and the moment, as load_model_weights refuses a non-finite weight.
* ``--resume --data.eot_token N`` under data.shuffle=documents or data.align=bos was taken: the saved position
  counts documents cut at the saved token, so under another one it named other batches (data re-read or skipped,
  unsaid), as a changed shuffle seed would (refused). The loader's state records the token and
  data/loader.py's load_state_dict refuses a change where it counts documents.
* ``rl --resume --kl-coef 0.2`` under --kl-target, or ``--kl-target 0``, was dropped in silence: the controller's
  saved coefficient went on (and, with the target off, stayed fixed at it) while config.json recorded the new
  settings. The RL state records the coefficient the controller started from, and a resume takes the command
  line's rl.kl_coef when that start changed or the controller is off (training/rl_state.py).
* A command whose work is files, with stdout a pipe whose reader left (``export hf ... | head -1``, ``eval --json
  e.json | true``, ``plan --json``, ``tokenizer train``, ``prepare``) ended at its first print (141), its outputs
  unwritten (eval had scored every problem). The CLI's one door runs every invocation that writes files (cli/outputs.py's
  writes_files, from the declared outputs) under environment.delivering: a failed stdout is pointed at /dev/null and
  the command writes them, then ends 141; one whose work is its stdout (sample, presets) still ends at once.

Probed and found sound (not tested again here): sample/chat --temperature nan/inf/-1/1e-300/1e300, --top-k -1 or
past the vocabulary, --top-p 0/1.5/nan/1e-300, --repetition-penalty 0/-1/nan/inf/1e-45/1e300, --stop '',
--prompt '', --num-samples 0/-1; chat with stdin closed, empty or binary; eval --tasks '', ',,', 'a,,b', ' a',
'ARITHMETIC', --limit 0 (the held-out set, said), --json onto a run dir or an existing link target; export onto a
file, a non-empty folder, a link to one; resume with a changed model shape, optimizer, shuffle or seed, shard
folder, an unknown preset, float16; --optim.beta1 -0.5, weight_decay nan, grad_clip -1, eps 0; HOME unset, TMPDIR
read-only or missing, LC_ALL=C with non-ASCII paths and prompts, COLUMNS 0/-5/abc/100000; `| head -1` on every
printing command (exit 141 or 0, no traceback); a LoRA resume with another rank, alpha or targets (refused) or dropout
(taken); --device cuda/mps on a CPU machine, tpu, cuda:-1, '' (one line); a meta.json edited to NaN/inf numbers,
wrong types, an unknown key, a list (refused naming the file and field); train --optim.min_lr_frac 2/-0.5,
cooldown_frac 1.5, batch_warmup_start 0/1.5, lr 0, warmup_steps -1, muon_ns_steps 0, muon_momentum 1, log_every 0,
dropout 1/-0.1, keep_ckpts -1 (one line each), val_every or ckpt_every past max_steps (the last step still does both).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gptforge.cli import main
from gptforge.data.aligned import AlignedShardLoader
from gptforge.data.loader import ShardLoader
from gptforge.data.shards import ShardError
from gptforge.run import checkpointer, restore
from gptforge.run.checkpoint import latest_checkpoint
from gptforge.storage.digest import sha256_file
from tests.run.faults import copy_run, one_line, train_argv


@pytest.fixture
def runs(world, base_run):
    """The session's shards and finished 4-step run (tests/conftest.py): copied by a test that changes it."""
    return world["shards"], base_run


def test_a_resume_trains_with_the_optimizer_settings_it_is_given_not_the_files(runs, tmp_path, monkeypatch):
    shards, run = runs
    run = copy_run(run, tmp_path)
    seen = {}
    real = checkpointer.Checkpointer.restore

    def spy(self, state):
        real(self, state)
        from gptforge.optim import build_optimizer

        seen["loaded"] = restore.settings(state.optimizer)
        seen["built"] = restore.settings(build_optimizer(state.model, self.cfg.optim, "cpu"))
        seen["state"] = len(state.optimizer.state)  # the moments were still loaded

    monkeypatch.setattr(checkpointer.Checkpointer, "restore", spy)
    assert main(train_argv(shards, run, "--resume", "--train.max_steps", "5", "--optim.weight_decay", "0.5",
                           "--optim.beta1", "0.5", "--optim.beta2", "0.99", "--optim.eps", "1e-6")) == 0
    decay = seen["loaded"][0]
    assert (decay["weight_decay"], decay["betas"], decay["eps"]) == (0.5, (0.5, 0.99), 1e-6)
    assert seen["loaded"] == seen["built"] and seen["state"] > 0


def _poison_optimizer(ck: Path, value: float) -> None:
    """One moment of optimizer.pt set to ``value``, meta.json's checksum rewritten to match (the damage the
    checksum cannot see: the file was written so, by hand or by another tool)."""
    path = ck / "optimizer.pt"
    saved = torch.load(path, weights_only=True)
    first = next(iter(saved["state"]))
    saved["state"][first]["exp_avg_sq"].view(-1)[0] = value
    torch.save(saved, path)
    meta = json.loads((ck / "meta.json").read_text())
    meta["files"]["optimizer.pt"] = sha256_file(path)
    (ck / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_optimizer_state_is_refused_before_a_step(runs, tmp_path, capsys, value):
    shards, run = runs
    run = copy_run(run, tmp_path)
    _poison_optimizer(latest_checkpoint(run), value)
    capsys.readouterr()
    assert main(train_argv(shards, run, "--resume", "--train.max_steps", "6")) == 2
    captured = capsys.readouterr()
    line = one_line(captured.err)
    assert "optimizer.pt" in line and "exp_avg_sq" in line and "NaN or infinite" in line, line
    assert "step      5" not in captured.out  # refused before training


def _shards(world) -> list[Path]:
    return sorted(Path(world["shards"]).glob("*train*.bin"))


@pytest.mark.parametrize("kind", ["documents", "bos"])
def test_a_resume_under_another_document_token_is_refused_where_documents_are_counted(world, kind):
    files = _shards(world)
    if kind == "documents":
        def make(eot):
            return ShardLoader(files, 2, 16, shuffle="documents", seed=3, eot=eot)
    else:
        def make(eot):
            return AlignedShardLoader(files, 2, 16, eot=eot)
    # make_shards' tokens are uniform in [0, 512): tokens 7 and 9 each start about one position in 512
    one = make(7)
    for _ in range(3):
        one.next_batch()
    state = json.loads(json.dumps(one.state_dict()))  # as meta.json holds it
    with pytest.raises(ShardError, match="data.eot_token 7.*data.eot_token 9.*--data.eot_token 7"):
        make(9).load_state_dict(state)
    same = make(7)
    same.load_state_dict(state)  # the same token resumes, on the very next batch
    assert np.array_equal(same.next_batch()[0].numpy(), one.next_batch()[0].numpy())


def test_the_document_token_is_not_a_condition_where_no_documents_are_counted(world):
    one = ShardLoader(_shards(world), 2, 16, eot=7)  # shuffle off: the position is a token offset
    one.next_batch()
    ShardLoader(_shards(world), 2, 16, eot=9).load_state_dict(one.state_dict())


@pytest.mark.parametrize("kl_coef,kl_target,recorded,used", [
    (0.1, 0.5, True, 0.13),  # the same settings: the controller goes on where it was
    (0.2, 0.5, True, 0.2),  # --kl-coef changed: the controller starts again from it
    (0.1, 0.0, True, 0.1),  # --kl-target 0: the fixed coefficient the command line gives
    (0.2, 0.0, True, 0.2),
    (0.2, 0.5, False, 0.13),  # a checkpoint from before the start was saved: its coefficient, as before
])
def test_an_rl_resume_takes_the_kl_settings_it_is_given(tmp_path, tokenizer, kl_coef, kl_target, recorded, used):
    """A run trained with --kl-target 0.5 --kl-coef 0.1 whose controller moved the coefficient to 0.13, resumed."""
    from types import SimpleNamespace

    from tests.training.test_rl_setup import _recipe

    r, cfg, _ = _recipe(tmp_path, tokenizer, kl_coef=0.1, kl_target=0.5)
    r.loaders(cfg, SimpleNamespace(rank=0, world=1))
    r.state.kl_coef = 0.13
    saved = json.loads(json.dumps(r.state.state_dict()))  # as meta.json holds it
    assert saved == {"kl_coef": 0.13, "kl_start": 0.1}
    if not recorded:
        del saved["kl_start"]
    again, cfg, _ = _recipe(tmp_path, tokenizer, kl_coef=kl_coef, kl_target=kl_target)
    again.loaders(cfg, SimpleNamespace(rank=0, world=1))
    again.state.load_state_dict(saved)
    assert again.kl_coef(SimpleNamespace(cfg=cfg)) == used


# each command whose work is files, with a stdout whose reader has left: (argv, what it writes), given world's files
DELIVERING = {
    "export": (["export", "hf", "--ckpt", "{chat}", "--out", "{tmp}/o"], "o/model.safetensors"),
    "eval --json": (["eval", "--ckpt", "{chat}", "--device", "cpu", "--tasks", "arithmetic", "--limit", "1",
                     "--json", "{tmp}/o.json"], "o.json"),
    "plan --json": (["plan", "--preset", "tiny", "--json", "{tmp}/o.json"], "o.json"),
}


def _closed_stdout_main(argv: list[str], monkeypatch) -> int:
    """``gptforge ARGV | true``: stdout a pipe whose reader has already left (every write is EPIPE)."""
    import os
    import sys

    r, w = os.pipe()
    os.close(r)
    with os.fdopen(w, "w", buffering=1) as pipe:
        monkeypatch.setattr(sys, "stdout", pipe)
        try:
            return main(argv)
        finally:
            monkeypatch.undo()


@pytest.mark.parametrize("name", sorted(DELIVERING))
def test_a_closed_stdout_does_not_cost_the_files_a_command_was_asked_for(world, tmp_path, monkeypatch, name):
    """The first print after the reader left ended the command (141) before it wrote them: `export ... | head -1`
    left no export, `eval --json e.json | true` scored every problem and wrote no e.json."""
    from gptforge import environment

    argv, wrote = DELIVERING[name]
    argv = [a.format(chat=world["chat"], tmp=tmp_path) for a in argv]
    assert _closed_stdout_main(argv, monkeypatch) == environment.EXIT_STDOUT_CLOSED
    assert (tmp_path / wrote).is_file()


@pytest.mark.parametrize("argv,files", [
    (["sample", "--ckpt", "c"], False), (["presets"], False), (["eval", "--ckpt", "c"], False),
    (["bench", "--preset", "tiny"], False),  # stdout is all these deliver: a reader that left ends them at once
    (["eval", "--ckpt", "c", "--json", "e.json"], True), (["export", "hf", "--ckpt", "c", "--out", "o"], True),
    (["prepare", "shakespeare"], True), (["assets", "tokenizer"], True),  # shards and the cache have a default place
])
def test_which_invocations_deliver_files(argv, files):
    from gptforge.cli import build_parser
    from gptforge.cli.outputs import writes_files

    args, _ = build_parser().parse_known_args(argv)
    assert writes_files(args.command, args) is files


def test_a_run_whose_reader_left_before_it_began_stops_at_its_first_step(runs, tmp_path, monkeypatch):
    """`train --resume ... | true`: the resume's notice met the closed pipe before the run began; under delivering
    it was not fatal, so the run trained every step to nobody. It stops as a reader leaving mid-run stops it."""
    from gptforge import environment

    shards, run = runs
    run = copy_run(run, tmp_path)
    code = _closed_stdout_main(train_argv(shards, run, "--resume", "--train.max_steps", "40"), monkeypatch)
    assert code == environment.EXIT_STDOUT_CLOSED
    assert latest_checkpoint(run).name == "step_000005"  # one step past the resumed 4, saved; not 40
