"""Hardening round twelve, careless and hostile use in classes earlier rounds did not test.

* An output whose place cannot take it (a file where a folder is needed above it, a read-only folder, a
  pseudo-filesystem) was met by each writer at its mkdir, after the work: `eval --json afile/e.json` scored every
  problem, `tokenizer train`, `bench` and `import` ran whole, and then said "afile: file exists". The CLI's output
  check (cli/outputs.py, every declared output of every command) asks run/preflight.py's place_fault, or a run's
  own preflight, before the command starts.
* A file output named with a trailing slash (``plan --json results/``) wrote a file named ``results``: refused, as a
  folder named for a file is (cli/outputs.py, every file output of every command).
* A shard folder whose `prepare` has not finished (stopped by Ctrl-C, SIGTERM, a killed job; manifest.json says
  "complete": false) was read by train as the corpus: a run trained on part of it without a word.
  data/shards.py's list_shards, every reader's one door to a shard folder, refuses it.
* optim.warmup_steps past train.max_steps (a long preset's warmup kept in a short run): the learning rate climbed
  for the whole run and never reached optim.lr, unsaid; the run now says so in one line.
* A mistyped option (``sample --promt``, ``train --preest``, ``export --outt``) was "gptforge: error: unrecognized
  arguments" from the top-level parser, pointing at ``gptforge --help``, with no hint (a mistyped --section.key
  had one); or, where the option it missed was required, only "required: --out". Every command's parser (and the
  tools') now names the command and the option it is close to (argparsing.refuse_strays, OneLineParser.error);
  ``--preset tinyy`` names ``tiny`` before the list of all presets (presets.get_preset).
* A shard shorter than one step (prepare's last, the remainder of its split: about half the time for a 10M-token
  corpus in 1M-token shards under gpt2-124m's 524,288-token step) refused the whole, complete folder ("fewer than
  one step needs ... add data"); the loader leaves it out, and the run says so (refused only when no shard holds a
  step).
* A run in a folder whose name is not UTF-8 (``--out $'runs/r\\xff'``) saved its checkpoints, then every resume,
  sample or export said "Path ... is not valid UTF-8; the checkpoint is damaged" (safetensors takes only UTF-8
  paths): run/restore.py's read_safetensors, the one reader of a checkpoint's weights, reads it by descriptor.
* A negative ``--seed`` (sample, chat, prepare conversations/preferences) was taken: Python's random takes -3 as 3,
  so ``--seed -3`` wrote the very problems ``--seed 3`` did; torch took -1 as 2**64-1 and refused 2**64-1 itself.
  Every seed flag of every parser is a seed as the config's are, [0, 2**32) (OneLineParser).
* A relative data.dir that does not resolve (a run's config.json read from another folder) names the folder it
  was looked for in.

Probed and found sound (not tested again here): --train.max_steps 0, a negative lr, a total batch not divisible,
--train.seed out of range, a close --section.key typo; OMP_NUM_THREADS / GPTFORGE_* / CUDA_VISIBLE_DEVICES junk; a
BOM, CRLF, UTF-16 or non-UTF-8 row in a chat JSONL; an empty, truncated or header-only shard; a truncated or empty
model.safetensors; sample/chat --max-new-tokens 0 or 10^9; `ulimit -f` mid-save; two resumes of one run at once
(the lock); Ctrl-C three times during a save; spaces and emoji in every path; a run resumed from another folder
on other shards of the same name (the loader's digests); sft data of the same name elsewhere (its fingerprint).
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from gptforge.cli import main
from tests.cli.test_writers import CASES, RUN_CASES
from tests.conftest import make_shards, tiny_chat_checkpoint, word_corpus
from tests.run.faults import one_line, train_argv


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """What the writers' walk reads (tests/cli/test_writers.py's CASES): a tiny chat checkpoint, a word corpus,
    shards, a run's metrics; and a file where a folder is expected."""
    tmp = tmp_path_factory.mktemp("probe12")
    w = {"ckpt": tiny_chat_checkpoint(tmp / "run"), "run": tmp / "run", "corpus": word_corpus(tmp / "corpus"),
         "shards": make_shards(tmp / "shards", n_train=4000, n_val=1000), "llmc": tmp / "absent.bin"}
    (tmp / "plotted").mkdir()
    (tmp / "plotted" / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "loss": 5.0}) + "\n")
    w["metrics"] = tmp / "plotted"
    (tmp / "afile").write_text("x")
    w["afile"] = tmp / "afile"
    return w


def _err(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's refusal (OneLineParser.error): exit 2 from the parser itself
        code = e.code
    assert code == 2, argv
    return one_line(capsys.readouterr().err)


def _walk():
    for (cmd, key), variants in CASES.items():
        if not key:  # assets: its place is $GPTFORGE_CACHE, not a flag (cli/outputs.py declares no flag for it)
            continue
        for label, name, argv, _ in variants:
            yield pytest.param(argv, name, id="-".join(x for x in (cmd, key.split(" ")[0].lstrip("-"), label) if x))
    for (cmd, _), argv in RUN_CASES.items():
        yield pytest.param(argv, "run", id=f"{cmd}-run")


@pytest.mark.parametrize("argv,name", list(_walk()))
def test_every_output_under_a_file_is_refused_before_the_work_naming_the_file(world, capsys, argv, name):
    """Every declared output of every command (the writers' walk), placed under a file: one line naming the file
    in the way, exit 2, before any work (eval had scored, tokenizer train had trained, bench had timed)."""
    afile = world["afile"]
    cmd = argv(world, str(afile / "sub" / name))
    err = _err(capsys, cmd)
    assert f"{afile} is a file" in err and "file exists" not in err, err
    assert afile.read_text() == "x"


@pytest.mark.parametrize("argv", [v for (_, key), vs in CASES.items() if key for _, name, v, _ in vs
                                  if "." in name])  # the file outputs of the writers' walk
def test_a_file_output_ending_in_a_slash_is_refused_not_written_as_a_file(world, tmp_path, capsys, argv):
    cmd = argv(world, f"{tmp_path / 'results'}/")
    flag = cmd[cmd.index(f"{tmp_path / 'results'}/") - 1]
    err = _err(capsys, cmd)
    assert err.endswith(f"error: {flag} {tmp_path}/results/ ends with '/', a folder; name the file to write in it "
                        f"({flag} {tmp_path}/results/FILE)"), err
    assert not (tmp_path / "results").exists()


def test_an_output_on_a_read_only_folder_is_refused_before_the_model_is_read(world, tmp_path, capsys, monkeypatch):
    """eval --json on a read-only disk: refused before --ckpt is even looked at (a missing checkpoint here: had the
    command run first, that would be the error), naming the folder and the disk's words. As root, chmod cannot make
    a folder read-only, so the kernel's answer to a new file there is injected where the probe asks it."""
    import tempfile

    real = tempfile.TemporaryFile
    ro = tmp_path / "ro"
    ro.mkdir()

    def refusing(*a, dir=None, **k):
        if dir is not None and Path(dir) == ro:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dir))
        return real(*a, dir=dir, **k)

    monkeypatch.setattr(tempfile, "TemporaryFile", refusing)
    out = ro / "new" / "e.json"
    err = _err(capsys, ["eval", "--ckpt", str(tmp_path / "missing"), "--tasks", "compare", "--json", str(out)])
    assert err.endswith(f"error: --json {out} cannot be written ({ro}: Read-only file system); choose a path on a "
                        "writable filesystem"), err
    monkeypatch.undo()
    err = _err(capsys, ["eval", "--ckpt", str(tmp_path / "missing"), "--tasks", "compare", "--json", str(out)])
    assert "missing" in err and "cannot be written" not in err, err  # a writable place: the command runs


def test_a_shard_folder_whose_prepare_did_not_finish_is_refused_until_it_does(world, tmp_path, capsys, monkeypatch):
    """prepare stopped after its first chunk of documents (as Ctrl-C or SIGTERM stops it: exit 130, finished shards
    kept, manifest.json "complete": false): train refused it in one line (it trained on the part before, silently);
    the same prepare again finishes it, and train takes it."""
    from gptforge.data.prepare import pipeline

    out = tmp_path / "shards"
    argv = ["prepare", "files", str(world["corpus"]), "--out", str(out), "--shard-tokens", "2000", "--val-tokens",
            "1000", "--workers", "1", "--no-progress", "--tokenizer", str(world["ckpt"])]
    real = pipeline._Writer.add_chunk

    def stopped(self, *a, **k):
        real(self, *a, **k)
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline._Writer, "add_chunk", stopped)
    assert main(argv) == 130
    monkeypatch.undo()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is False and manifest["shards"], manifest  # whole shards, a part of the corpus
    run = ["train", "--preset", "tiny", "--data.dir", str(out), "--train.device", "cpu", "--train.max_steps", "1",
           "--train.val_every", "0", "--train.sample_every", "0", "--model.vocab_size", "50304"]
    err = _err(capsys, [*run, "--out", str(tmp_path / "r1")])
    n = len(manifest["shards"])
    assert err.endswith(f"error: data directory {out}: the `gptforge prepare` that writes it has not finished "
                        f"({out / 'manifest.json'} says \"complete\": false; {n} shard{'s' * (n != 1)}, "
                        f"{manifest['tokens']:,} tokens so far), so a run would train on part of the corpus; run the "
                        "same prepare command again to finish it (it resumes where it stopped), or, to train on what is "
                        f"there, delete {out / 'manifest.json'} (prepare then cannot resume it)"), err
    assert not (tmp_path / "r1").exists()
    assert main(argv) == 0 and json.loads((out / "manifest.json").read_text())["complete"] is True
    capsys.readouterr()
    assert main([*run, "--out", str(tmp_path / "r2"), "--model.n_layer", "1"]) == 0


def test_a_warmup_past_the_runs_steps_is_said_once(world, tmp_path, capsys):
    """--optim.warmup_steps 10 in a 2-step run: lr 1e-4 then 2e-4 of optim.lr 1e-3, no decay, not a word before."""
    from gptforge.config import OptimConfig
    from gptforge.optim.schedule import lr_at, schedule_note

    capsys.readouterr()
    assert main(train_argv(world["shards"], tmp_path / "r", "--optim.warmup_steps", "10", "--train.max_steps", "2",
                           "--optim.lr", "1e-3")) == 0
    out = capsys.readouterr().out
    said = [x for x in out.splitlines() if x.startswith("optim.warmup_steps=")]
    assert said == ["optim.warmup_steps=10 > train.max_steps=2: the learning rate warms up for the whole run and never "
                    "reaches optim.lr=0.001 (it ends at 2.00e-04), with no decay; lower --optim.warmup_steps (a few "
                    "percent of the steps) for a warmup and a decay"], out
    cfg = OptimConfig(lr=1e-3, warmup_steps=4)
    assert lr_at(3, cfg, 4) == 1e-3 and schedule_note(cfg, 4) is None  # reaches optim.lr at its last step, as asked
    assert schedule_note(cfg, 3) and schedule_note(OptimConfig(lr=1e-3, warmup_steps=0), 1) is None


def test_a_relative_data_dir_that_does_not_resolve_names_where_it_was_looked_for(world, tmp_path, capsys, monkeypatch):
    """A run's config.json keeps data.dir as given ("data/x"): resumed from another folder, it was "data directory
    data/x does not exist", with nothing to say it was read against the current folder."""
    monkeypatch.chdir(tmp_path)
    err = _err(capsys, train_argv("data/x", tmp_path / "r"))
    assert err.endswith(f"data directory data/x (read from the current folder: {tmp_path}/data/x) does not exist; "
                        "run `gptforge prepare ...` first, or run from the folder it is relative to"), err


@pytest.mark.parametrize("argv,said", [
    (["sample", "--ckpt", "x", "--promt", "hi"],
     "gptforge sample: error: unrecognized arguments: --promt hi; did you mean --prompt"),
    (["train", "--preest", "tiny"], "gptforge train: error: unrecognized arguments: --preest; did you mean --preset?"),
    (["plan", "--preset", "tiny", "--out", "r"], "gptforge plan: error: unrecognized arguments: --out (see"),  # not --gpu
    (["tokenizer", "train", "c", "--out", "t", "--vocab-sise", "300"],
     "gptforge tokenizer train: error: unrecognized arguments: --vocab-sise 300; did you mean --vocab-size?"),
    (["export", "hf", "--ckpt", "x", "--outt", "e"],
     "gptforge export: error: the following arguments are required: --out; --outt is not an option here: did you "
     "mean --out?"),
    (["train", "--preset", "tiny", "--optim.lrr", "1"], "unknown config key --optim.lrr; did you mean --optim.lr"),
    (["train", "--preset", "tinyy"], "gptforge train: error: unknown preset 'tinyy'; did you mean tiny? (known presets:"),
])
def test_a_mistyped_option_is_named_by_its_command_with_the_one_it_is_close_to(capsys, argv, said):
    err = _err(capsys, argv)
    assert said in err, err


def test_a_tools_mistyped_option_is_named_with_the_one_it_is_close_to(capsys):
    from gptforge.argparsing import tool_parser

    p = tool_parser("python -m gptforge.bench.x", "a tool")
    p.add_argument("--json")
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--jsno", "x.json"])
    assert e.value.code == 2 and "unrecognized arguments: --jsno x.json; did you mean --json?" in capsys.readouterr().err


def test_a_shard_shorter_than_one_step_is_left_out_and_said(world, tmp_path, capsys):
    """A complete folder whose last train shard (the remainder) holds fewer tokens than one step reads."""
    import shutil

    import numpy as np

    from gptforge.data.loader import ShardLoader
    from gptforge.data.shards import ShardError, list_shards, write_shard

    data = tmp_path / "data"
    shutil.copytree(world["shards"], data)
    short = write_shard(data / "toy_train_000009.bin", np.arange(100, dtype=np.uint16) % 512)  # after the others
    files = list_shards(data, "train", "val")
    loader = ShardLoader(files, B=4, T=32, step_tokens=256)  # a step: 256 tokens (+1), as tiny's
    assert loader.skipped == [(short, 100)] and short not in loader.files
    for _ in range(200):  # past an epoch: the short shard is never opened (before: refused at the start)
        loader.next_batch()
    assert loader.epoch >= 1 and loader.files == files[:-1] and loader.state_dict()["files"] == [f.name for f in files[:-1]]
    with pytest.raises(ShardError, match=r"toy_train_000000.bin: 2000 tokens is fewer than one step needs \(B\*T\*world"
                                         r"\+1 = 4097\) \(and so is every other of its 3 shards\)"):
        ShardLoader(files, B=4, T=1024)  # none holds a step: refused, naming the largest
    capsys.readouterr()
    assert main(train_argv(data, tmp_path / "r", "--train.max_steps", "1")) == 0
    assert f"{short}: 100 tokens, fewer than one step reads: left out (the other shards of its split are read)" \
        in capsys.readouterr().out


def test_a_run_in_a_folder_whose_name_is_not_utf8_resumes_and_samples(world, tmp_path, capsys):
    run = Path(os.fsdecode(bytes(tmp_path) + b"/r\xff\xfe"))
    assert main(train_argv(world["shards"], run, "--train.max_steps", "2")) == 0
    capsys.readouterr()
    assert main(train_argv(world["shards"], run, "--train.max_steps", "3", "--resume")) == 0, capsys.readouterr().err
    assert main(["sample", "--ckpt", str(run), "--prompt", "a", "--max-new-tokens", "2"]) == 0


@pytest.mark.parametrize("argv", [["prepare", "conversations", "arithmetic", "--n", "5", "--seed", "-3", "--out", "c.jsonl"],
                                  ["sample", "--ckpt", "x", "--seed", str(2**32)],
                                  ["chat", "--ckpt", "x", "--seed", "-1"],
                                  ["sft", "--init-from", "x", "--data", "d.jsonl", "--out", "r", "--seed", "-1"]])
def test_every_seed_flag_is_a_seed_in_the_configs_range(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    seed = argv[argv.index("--seed") + 1]
    err = _err(capsys, argv)
    assert f"error: argument --seed: {seed} is not a seed: expected an integer in [0, 2**32)" in err, err
    assert not (tmp_path / "c.jsonl").exists()


def test_the_largest_seed_is_taken(world, capsys):
    assert main(["sample", "--ckpt", str(world["run"]), "--prompt", "a", "--max-new-tokens", "1", "--num-samples", "1",
                 "--seed", str(2**32 - 1)]) == 0

