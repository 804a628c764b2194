"""Hardening round eleven, careless and hostile use in classes earlier rounds did not test.

* A path that cannot be one: a name past the filesystem's limit (ENAMETOOLONG) or a symlink loop (ELOOP,
  pathlib's "Symlink loop from", or the "file exists" a mkdir over a loop meets) was a traceback from whichever
  reader or writer touched it first (train's preflight, sample's resolve, export's own-source check, prepare,
  eval's --json). The command line's one door (gptforge.cli) says it in one line (reading.path_fault), and the
  readers that say what a path is (reading.not_a_file; the data folder, a shard, a checkpoint) call a loop a
  loop and a link to a device a device, not "a symlink to a missing file" or "which does not exist"; so does
  --tokenizer.
* Generation refuses a prompt id past the model's vocabulary where every generation starts (stream_tokens); eval's
  generative tasks said IndexError (arithmetic) or scored every prompt wrong unread (gsm8k).
* A CPU step whose logits alone outgrow the free memory is refused before the model is built; the CPU allocator's
  refusal inside a step is oom_advice, one line.
* An output path beginning with a literal '~' (--out=~/x) is refused naming the path the shell would have made.
* The "next:" hints quote a path with a newline or a non-UTF-8 byte in bash's $'...'.
* prepare never writes shards into a run or a checkpoint; train never starts a run inside a checkpoint or a run's
  checkpoints folder.
* A JSONL line is read at most 64 MiB at a time (sft/rm/dpo --data, prepare files): a .jsonl.gz bomb is a bad row.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gptforge.cli import main
from tests.conftest import make_shards
from tests.run.faults import finished_run, one_line, train_argv


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Tiny shards, a finished 4-step run, a symlink loop and a link to a device."""
    tmp = tmp_path_factory.mktemp("probe11")
    shards = make_shards(tmp / "shards", 20_000, 4_000)
    os.symlink(tmp / "loop_b", tmp / "loop_a")
    os.symlink(tmp / "loop_a", tmp / "loop_b")
    return {"tmp": tmp, "shards": shards, "run": finished_run(shards, tmp / "run"), "loop": tmp / "loop_a"}


def _err(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 2, argv
    return one_line(capsys.readouterr().err)


LOOP = "a symlink loop (its links lead back to themselves)"


def test_a_name_too_long_or_a_symlink_loop_is_one_line_at_every_door(world, tmp_path, capsys):
    (tmp_path / "a.txt").write_text("the king and the queen\n" * 50)
    long = str(world["tmp"] / ("a" * 300))
    too_long = "file name too long (most filesystems allow a name of at most 255 bytes"
    run, loop = str(world["run"]), str(world["loop"])
    for argv in (train_argv(world["shards"], Path(long)),                      # train's preflight stat
                 ["sample", "--ckpt", long, "--max-new-tokens", "2"],           # a reader's resolve
                 ["export", "hf", "--ckpt", run, "--out", long, "--no-tokenizer"],  # an output's check
                 ["prepare", "files", "--workers", "1", str(tmp_path), "--out", long]):
        err = _err(capsys, argv)
        assert f"error: {long}" in err and too_long in err, (argv[0], err)  # export names {long}/meta.json
    for argv, where in ((train_argv(world["shards"], Path(loop)), loop),          # mkdir over a loop: "file exists"
                        (train_argv(world["shards"], Path(loop) / "x"), f"{loop}/x"),  # ELOOP
                        (["export", "hf", "--ckpt", run, "--out", loop, "--no-tokenizer"], loop)):  # pathlib's resolve
        err = _err(capsys, argv)
        assert err.endswith(f"error: {where}: {LOOP}; fix or remove the link"), (argv[0], err)
    assert not any(p.name.startswith(("a" * 10, "x")) for p in world["tmp"].iterdir())


def test_readers_call_a_loop_a_loop_and_a_link_to_a_device_a_device(world, tmp_path, capsys):
    from gptforge.reading import not_a_file

    loop = world["loop"]
    assert not_a_file(loop) == LOOP
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    assert not_a_file(tmp_path / "dangling") == "a symlink to a missing file"
    from gptforge.data.tokenizer import TokenizerError, load_tokenizer

    for spec, what in (("/dev/null", "a device or other special file"), (loop, LOOP),
                       (tmp_path / "dangling", "a symlink to a missing file")):  # was "not gpt2, a tiktoken name..."
        with pytest.raises(TokenizerError, match=f"^--tokenizer {spec}: {re.escape(what)}"):
            load_tokenizer(spec)
    err = _err(capsys, train_argv(loop, tmp_path / "r1"))
    assert f"data directory {loop} is {LOOP}" in err, err
    err = _err(capsys, ["sample", "--ckpt", str(loop), "--max-new-tokens", "2"])
    assert err.endswith(f"checkpoint {loop} is {LOOP}"), err
    data = tmp_path / "data"
    make_shards(data, 2_000, 1_000)
    (data / "toy_train_000001.bin").unlink()
    os.symlink("/dev/zero", data / "toy_train_000001.bin")
    err = _err(capsys, train_argv(data, tmp_path / "r2"))
    assert "toy_train_000001.bin is a device or other special file (not a regular file) (a symlink to '/dev/zero')" \
        in err, err


def test_generation_refuses_a_prompt_id_past_the_vocabulary_at_its_one_start(world, capsys):
    """A model of 512 ids evaluated on a generated task, whose prompts GPT-2's tokenizer writes: an IndexError from
    the repetition-penalty table (``seen[b, ids]``) before; now eval names it in its words, and any other caller of
    generation (RL rollouts, training's samples, bench) meets generation's own PromptError."""
    from gptforge.generation import PromptError, SamplingParams, stream_tokens
    from gptforge.models.gpt2 import GPT, GPTConfig

    err = _err(capsys, ["eval", "--ckpt", str(world["run"]), "--tasks", "arithmetic", "--limit", "2"])
    assert "the model's vocab_size is 512, but arithmetic's prompts were tokenized to ids up to " in err, err
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=16, vocab_size=10))
    for bad in (10, -1):
        with pytest.raises(PromptError, match=f"^prompt 1: token id {bad} is outside this model's vocabulary of 10"):
            next(stream_tokens(model, [[1, 2], [3, bad]], SamplingParams(max_new_tokens=2, temperature=0.0)))
    assert next(stream_tokens(model, [[9]], SamplingParams(max_new_tokens=2, temperature=0.0))).shape == (1,)


def test_a_cpu_step_that_cannot_fit_is_refused_before_allocating_and_an_allocator_refusal_is_advice(
        world, tmp_path, capsys, monkeypatch):
    """A micro-batch whose logits outgrow the CPU's free memory (B 256 x T 1024 x 50,304 ids: 49 GiB) was a raw
    ``DefaultCPUAllocator: can't allocate memory`` traceback after gigabytes were allocated, or the OOM killer;
    an allocator refusal inside a step skipped oom_advice (it is a RuntimeError, not torch.OutOfMemoryError)."""
    from gptforge.config import apply_overrides
    from gptforge.models.registry import counts
    from gptforge.presets import get_preset
    from gptforge.resources import FreeMemory
    from gptforge.run.faults import check_step_memory
    from gptforge.training.pretrain import Pretrain

    cfg = apply_overrides(get_preset("tiny"), ["--model.vocab_size", "512"])
    B, T, Vp = cfg.train.micro_batch, cfg.train.seq_len, cfg.model.padded_vocab_size
    row = T * Vp * 4  # float32 logits of one sequence
    bound = 4 * counts(cfg.model, T).params + B * row
    free = {"bytes": bound - 1}
    monkeypatch.setattr("gptforge.resources.free_memory", lambda: FreeMemory(free["bytes"]))
    err = _err(capsys, train_argv(world["shards"], tmp_path / "r1"))
    assert f"train.micro_batch={B:,} x train.seq_len={T:,} on the CPU needs at least" in err, err
    assert f"lower --train.micro_batch well below {B:,} (gradient accumulation" in err, err  # B-1 rows fit the bound
    assert not (tmp_path / "r1").exists()  # refused before the run directory or the model
    free["bytes"] = bound
    check_step_memory(cfg, "cpu")  # the bound itself fits
    with pytest.raises(Exception, match=r"in each of 2 processes"):
        check_step_memory(cfg, "cpu", ranks_here=2)  # ranks on one machine share its memory
    check_step_memory(cfg, "cuda", ranks_here=2)  # CUDA's own OOM and `gptforge plan` size a GPU
    free["bytes"] = 4 * counts(cfg.model, T).params
    with pytest.raises(Exception, match="lower --train.seq_len or use a smaller model"):
        check_step_memory(cfg, "cpu")
    free["bytes"] = 1 << 50

    def refused(self, run, step):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 52747567104 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(Pretrain, "step", refused)
    err = _err(capsys, train_argv(world["shards"], tmp_path / "r2"))
    assert err.startswith(f"gptforge train: error: out of memory at micro_batch {B} x seq_len {T}") and \
        f"Try: --train.micro_batch {B // 2}" in err, err


def test_an_output_path_with_a_literal_tilde_is_refused_naming_the_path_the_shell_would_have_made(
        world, tmp_path, capsys, monkeypatch):
    """``--out=~/runs/x`` (no shell expands ~ after '='), or a quoted '~/x': the run, export or shards were written
    silently into a folder named '~' under the current one."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", "/home/someone")
    tail = "which the shell leaves unexpanded after '=' and in quotes, so it would make a folder named '~' in the current one"
    for argv, flag, rest in ((["export", "hf", "--ckpt", str(world["run"]), "--out=~/e1", "--no-tokenizer"], "--out", "e1"),
                             (["train", "--preset", "tiny", "--data.dir", str(world["shards"]), "--model.vocab_size", "512",
                              "--train.device", "cpu", "--train.out_dir=~/t1"], "--train.out_dir", "t1"),
                             (["prepare", "files", str(tmp_path), "--out", "~"], "--out", "")):
        err = _err(capsys, argv)
        path = f"~/{rest}" if rest else "~"
        assert err.endswith(f"error: {flag} {path} begins with a literal '~', {tail}; write {flag} /home/someone"
                            f"{'/' + rest if rest else ''}, or ./{path} for a folder named '~'"), err
    assert not (tmp_path / "~").exists()
    from gptforge.storage.guards import literal_home

    assert "give the full path (no user 'nobody_gptforge' here)" in literal_home("~nobody_gptforge/x")
    assert literal_home("./~/x") is None and literal_home("a~b") is None


def test_a_hinted_command_names_a_path_with_a_newline_or_a_non_utf8_byte_as_its_own_bytes():
    """A run in a folder whose name holds bytes that are not UTF-8 (``--out $'runs/r\\xff'``) or a newline: the
    "next:" hints quoted it for the shell with shlex, and stdout wrote the surrogates as U+FFFD, so the pasted
    command named another folder. Every hint quotes through cli.hints.q, which now uses bash's $'...'."""
    import subprocess

    from gptforge.cli.hints import next_commands, q

    cases = [b"runs/r\xff\xfe", b"runs/r\nx", b"runs/it's a\\b", b"runs/\xc3\xa9t\xc3\xa9 x", b"runs/t\tb\x01", b"runs/a\\n'b\n"]
    words = [q(os.fsdecode(b)) for b in cases]
    assert words[0] == "$'runs/r\\xff\\xfe'" and words[1] == "$'runs/r\\x0ax'" and words[3] == "'runs/\u00e9t\u00e9 x'"
    assert all(w.isprintable() for w in words) and all(w.encode("utf-8") for w in words)  # stdout writes them as is
    said = subprocess.run(["bash", "-c", "printf '%s\\0' " + " ".join(words)], capture_output=True, check=True).stdout
    assert said.split(b"\0")[:-1] == cases  # the shell reads each word back as the path's own bytes
    hint = next_commands("train", os.fsdecode(b"runs/r\xff\xfe"), "arithmetic")[0]
    assert "--ckpt $'runs/r\\xff\\xfe'" in hint and hint.isprintable(), hint


def test_prepare_never_writes_shards_into_a_run_or_a_checkpoint(world, tmp_path, capsys):
    """prepare's shard folder is resumable, so the --force check of file outputs skipped it: `--out RUN`,
    `--out RUN/checkpoints` or `--out RUN/checkpoints/step_N` wrote shards, manifest.json and tokenizer/ into the
    run (into a checkpoint's own folder, over its tokenizer bundle)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(world["run"], run)
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the king and the queen\n" * 200)
    for out, what in ((run, "that is the run directory"), (run / "checkpoints", "that is inside the run directory"),
                      (run / "checkpoints" / "step_000004", "that is the checkpoint")):
        err = _err(capsys, ["prepare", "files", "--workers", "1", "--no-progress", str(corpus), "--out", str(out)])
        assert err.endswith(f"--out {out}: {what} {out if what.endswith('checkpoint') else run}, which only training "
                            "writes; prepare its shards in a folder of their own (e.g. data/NAME)"), err
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before  # nothing written, nothing touched


def test_a_new_run_is_never_started_inside_another_runs_checkpoint_or_checkpoints_folder(world, tmp_path, capsys):
    """`train --out RUN/checkpoints/step_N` (or RUN/checkpoints, or a folder under either) trained a whole new run
    there: its checkpoints/, metrics.jsonl and config.json nested in another run's checkpoint."""
    run = world["run"]
    cks = run / "checkpoints"
    for out, said in ((cks / "step_000004", f"is the checkpoint {cks / 'step_000004'}:"),
                      (cks / "step_000004" / "x", f"is inside the checkpoint {cks / 'step_000004'}:"),
                      (cks, f"is inside the run directory {run} (its checkpoints folder):"),
                      (cks / "new", f"is inside the run directory {run} (its checkpoints folder):")):
        err = _err(capsys, train_argv(world["shards"], out))
        assert f"train.out_dir='{out}' {said} a new run there would be read as that run's files" in err, err
    assert sorted(p.name for p in cks.iterdir()) == ["step_000002", "step_000004"]
    assert not (cks / "step_000004" / "checkpoints").exists()


@pytest.mark.parametrize("gz", [False, True])
def test_a_data_line_past_the_row_bound_is_named_without_reading_it_whole(tmp_path, monkeypatch, gz):
    """sft/rm/dpo --data (data/rows.py, the one JSONL row reader): a .jsonl.gz of 13 MB that expands to 3 GB of
    one line was read whole (3 GB, 75 s, then a MemoryError traceback; the OOM killer on a bigger one). Each line
    is now read at most MAX_ROW_BYTES at a time; one longer is a bad row, and --skip-bad reads past it in pieces."""
    import gzip

    from gptforge.data import rows

    monkeypatch.setattr(rows, "MAX_ROW_BYTES", 200)
    good = b'{"messages": "a"}\n'
    huge = b'{"messages": "' + b"x" * 1000 + b'"}\n'
    body = good + huge + b'{"messages": "' + b"y" * 184 + b'"}\n' + good  # the third: 200 bytes and its newline, in bound
    path = tmp_path / ("d.jsonl.gz" if gz else "d.jsonl")
    path.write_bytes(gzip.compress(body) if gz else body)
    seen = []
    real = rows.bounded_lines
    monkeypatch.setattr(rows, "bounded_lines", lambda f, limit: (seen.append(len(x or b"")) or x for x in real(f, limit)))
    with pytest.raises(rows.DataError, match=rf"^{re.escape(str(path))}:2: a line of more than 200 bytes, more than "
                                             "a row holds"):
        rows.read_rows(str(path), "train", ("messages",), lambda r: None)
    assert seen == [len(good), 0]  # the huge line was never held: judged at its first 201 bytes
    stats = {"skipped": 0}
    got = rows.read_rows(str(path), "train", ("messages",), lambda r: None, skip_bad=True, stats=stats)
    assert [w for w, _ in got] == [f"{path}:1", f"{path}:3", f"{path}:4"] and stats["skipped"] == 1
    assert len(got[1][1]["messages"]) == 184
    # prepare files reads its JSONL documents through the same line reader: the long line is a bad row there too
    from gptforge.data.prepare import sources

    monkeypatch.setattr(sources, "bounded_lines", lambda f: real(f, 200))
    (tmp_path / "p").mkdir()
    text = body.replace(b"messages", b"text")
    (tmp_path / "p" / path.name).write_bytes(gzip.compress(text) if gz else text)
    items = list(sources.FilesSource([str(tmp_path / "p")]).items())
    assert [(i.where.rsplit(":", 1)[1], i.text is None) for i in items] == [("1", False), ("2", True), ("3", False),
                                                                           ("4", False)]
    assert items[1].reason.startswith("a line of more than ") and "more than a row holds" in items[1].reason
