"""Issue 21 class 7: operator mistakes reach no code. Each is refused with one line naming the flag,
key or file (exit 2), or, for defaults that do not fit a small model, clamped instead of refused."""

from __future__ import annotations

import io
import json
import os

import pytest
import torch

from gptforge.cli import main
from gptforge.config import ConfigError, apply_overrides, config_keys
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.presets import PRESETS, get_preset
from gptforge.run import checkpoint as ckpt
from tests.conftest import tiny_config


def _one_line(capsys, argv, *needles):
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # refused by the parser itself (an empty value, a bad choice)
        code = e.code
    assert code == 2, argv
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err


# --- config: every numeric field, every flag ---------------------------------------------------------

def _numeric_keys(arch: str, kinds=(int, float)) -> list[str]:
    pre = ["--model.arch", arch] if arch != "gpt2" else []
    keys = config_keys(apply_overrides(get_preset("tiny"), pre))
    return [k for k, tp in keys.items() if tp in kinds or str(tp) in [f"typing.Optional[{t.__name__}]" for t in kinds]]


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("raw", ["-1", "1e30"])
def test_every_numeric_config_key_refuses_a_negative_or_absurd_value_by_name(arch, raw):
    """-1 for every number; 1e30 for every integer (a count past 2**53 is a typo that overflows torch;
    a float of 1e30 is finite and allowed: a 1e30 lr is how the divergence tests diverge)."""
    pre = ["--model.arch", arch] if arch != "gpt2" else []
    accepted = []
    for key in _numeric_keys(arch, (int, float) if raw == "-1" else (int,)):
        try:
            apply_overrides(get_preset("tiny"), [*pre, f"--{key}", raw])
            accepted.append(key)
        except ConfigError as e:
            assert key.split(".")[1] in str(e) or key.split(".")[0] in str(e), (key, str(e))
    assert accepted == [], f"{raw} accepted for {accepted}"


def test_optim_eps_minus_one_is_one_line_not_adamw_traceback(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_line(capsys, ["train", "--preset", "tiny", "--optim.eps", "-1"], "optim.eps=-1.0")


def test_empty_out_is_refused_not_the_presets_folder(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_line(capsys, ["train", "--preset", "tiny", "--out", "", "--dry-run"], "--out: '' is empty")
    _one_line(capsys, ["train", "--preset", "tiny", "--train.out_dir", " ", "--dry-run"], "train.out_dir=' '")
    _one_line(capsys, ["race", "tiny", "tiny-llama", "--out", ""], "--out")


@pytest.mark.parametrize("argv,flag", [
    (["--out", "runs/x", "--optim.lr"], "--optim.lr"),  # the value forgotten at the end
    (["--optim.lr", "--train.max_steps", "5"], "--optim.lr"),  # ... or in the middle
])
def test_a_forgotten_value_is_blamed_on_its_own_flag(capsys, tmp_path, monkeypatch, argv, flag):
    monkeypatch.chdir(tmp_path)
    err = _one_line(capsys, ["train", "--preset", "tiny", "--dry-run", *argv], f"{flag} needs a value")
    assert "runs/x" not in err and "expected a number" not in err


# --- data and model files ------------------------------------------------------------------------------

def test_a_dangling_symlink_shard_is_named(shard_dir, tmp_path, capsys):
    link = shard_dir / "toy_train_000009.bin"
    os.symlink(tmp_path / "gone.bin", link)
    cfg = tiny_config(shard_dir, tmp_path / "run")
    _one_line(capsys, ["train", "--preset", "tiny", "--data.dir", str(shard_dir), "--out", str(tmp_path / "run"),
                       "--model.vocab_size", str(cfg.model.vocab_size), "--train.device", "cpu"],
              str(link), "a symlink to a missing file", "gone.bin")  # what it leads to, not only that it is gone
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_directory_as_llmc_is_called_a_directory(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    _one_line(capsys, ["sample", "--llmc", str(tmp_path / "d")], "is a directory")


def test_an_llmc_model_with_a_small_vocabulary_is_refused_a_gpt2_prompt(tmp_path, capsys):
    from gptforge.interop.llmc import write_llmc_model

    torch.manual_seed(0)
    path = write_llmc_model(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=100)),
                            tmp_path / "m.bin")
    _one_line(capsys, ["sample", "--llmc", str(path), "--num-samples", "1"],
              "token id 15496", "vocabulary of 100")


# --- generation lengths: defaults clamp, explicit values that cannot fit are refused ----------------------

@pytest.fixture(scope="module")
def small_ckpt(tmp_path_factory):
    from gptforge.config import Config

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16)
    return ckpt.save_checkpoint(tmp_path_factory.mktemp("s") / "run", 1, GPT(cfg), None,
                                {"config": Config(model=cfg).to_dict()})


def test_sample_clamps_its_default_and_refuses_an_explicit_length_that_cannot_fit(small_ckpt, capsys):
    assert main(["sample", "--ckpt", str(small_ckpt), "--num-samples", "1", "--prompt", "Hi", "--device", "cpu"]) == 0
    _one_line(capsys, ["sample", "--ckpt", str(small_ckpt), "--num-samples", "1", "--prompt", "Hi",
                       "--max-new-tokens", "100"], "--max-new-tokens 100", "at most 15")


def test_chat_default_reply_length_fits_a_small_context(tmp_path, capsys, monkeypatch):
    from gptforge.config import Config
    from gptforge.data.chat import ChatTemplate

    t = ChatTemplate.gpt2()
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=t.vocab_size)
    path = ckpt.save_checkpoint(tmp_path / "sft", 1, GPT(cfg), None,
                                {"config": Config(model=cfg).to_dict(), "chat_template": t.to_dict()})
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n/quit\n"))
    assert main(["chat", "--ckpt", str(path), "--temperature", "0", "--device", "cpu"]) == 0  # default 128 > 32
    out = capsys.readouterr().out
    assert "assistant> " in out and "not sent" not in out


def test_serve_clamps_its_default_and_refuses_an_explicit_length_that_cannot_fit(tokenizer):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from gptforge.serve.app import ServeSettings, create_app

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16)).eval()
    with TestClient(create_app(model, tokenizer, ServeSettings())) as c:
        r = c.post("/api/generate", json={"prompt": "Hi", "seed": 1})  # default 64 > a 16-token context
        assert r.status_code == 200, r.text
        r = c.post("/api/generate", json={"prompt": "Hi", "max_new_tokens": 64})
        assert r.status_code == 400 and "at most 15" in r.json()["error"]
    html = (__import__("gptforge.serve.app", fromlist=["STATIC"]).STATIC / "index.html").read_text()
    assert "box.value = Math.max(1, Math.min(most" in html  # the page lowers its own default too


def test_sample_bounds_the_number_of_rows_before_loading_anything(tmp_path, capsys):
    missing = str(tmp_path / "nothing")  # refused before the checkpoint is even looked for
    _one_line(capsys, ["sample", "--ckpt", missing, "--num-samples", "1000000"], "--num-samples 1000000")
    _one_line(capsys, ["sample", "--ckpt", missing, "--num-samples", "600", "--prompt", "a", "--prompt", "b"],
              "--num-samples 600 x 2 prompt(s)")
    _one_line(capsys, ["sample", "--ckpt", missing, "--num-samples", "0"], "--num-samples 0")


@pytest.mark.parametrize("port", ["99999", "65536", "-5", "http"])  # never one that binds: a regression would serve forever
def test_serve_port_out_of_range_is_one_line(capsys, port):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--random", "d2", "--port", port])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--port" in err and "Traceback" not in err


# --- the tokenizer, race, SFT rows, resume wording -----------------------------------------------------------

@pytest.mark.parametrize("damage", ["flip", "truncate", "directory"])
def test_damaged_tokenizer_ranks_name_the_fix(tokenizer, tmp_path, capsys, monkeypatch, damage):
    from gptforge import assets
    from gptforge.data.tokenizer import gpt2_tokenizer

    bad = tmp_path / "gpt2.tiktoken"
    data = assets.gpt2_ranks_path().read_bytes()
    if damage == "flip":
        bad.write_bytes(data[:1000] + bytes([data[1000] ^ 1]) + data[1001:])
    elif damage == "truncate":
        bad.write_bytes(data[: len(data) // 2])
    else:
        bad.mkdir()
    monkeypatch.setenv("GPTFORGE_GPT2_RANKS", str(bad))
    gpt2_tokenizer.cache_clear()
    try:
        _one_line(capsys, ["sample", "--random", "d2", "--num-samples", "1", "--max-new-tokens", "2"],
                  str(bad), "gptforge assets tokenizer")
    finally:
        monkeypatch.delenv("GPTFORGE_GPT2_RANKS")
        gpt2_tokenizer.cache_clear()


@pytest.fixture
def race_presets(monkeypatch, shard_dir, tmp_path):
    def good():
        return tiny_config(shard_dir, tmp_path / "unused", max_steps=8, val_tokens=256)

    def small_vocab():  # the data's ids reach 511
        cfg = good()
        cfg.model.vocab_size = 300
        return cfg

    monkeypatch.setitem(PRESETS, "race-good", good)
    monkeypatch.setitem(PRESETS, "race-small-vocab", small_vocab)


@pytest.mark.parametrize("target", ["nan", "inf", "-1", "0"])
def test_race_refuses_a_target_that_is_not_a_loss(race_presets, tmp_path, capsys, target):
    argv = ["race", "race-good", "race-good,train.seed=2", "--target", target, "--out", str(tmp_path / "r"),
            "--no-plot"]
    if target in ("nan", "inf"):  # no finite number: the flag's type (gptforge.numbers) refuses it at parse time
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert "--target" in err and f"'{target}' is not a finite number" in err, err
    else:
        _one_line(capsys, argv, "--target")
    assert not (tmp_path / "r").exists()


def test_race_checks_every_presets_data_before_the_first_trains(race_presets, tmp_path, capsys):
    _one_line(capsys, ["race", "race-good", "race-small-vocab", "--out", str(tmp_path / "r"), "--no-plot"],
              "model.vocab_size=300")
    assert not (tmp_path / "r" / "race-good").exists()  # the first preset never started


def test_a_deeply_nested_sft_row_is_a_named_bad_row(tmp_path):
    from gptforge.data.chat import ChatTemplate
    from gptforge.data.sft import SFTDataError, read_conversations, render_all

    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    path = tmp_path / "conv.jsonl"
    deep = '{"messages": ' + "[" * 200_000 + "]" * 200_000 + "}"
    path.write_text(json.dumps(good) + "\n" + deep + "\n" + json.dumps(good) + "\n")
    with pytest.raises(SFTDataError, match=f"{path}:2: JSON nested too deeply"):
        read_conversations(str(path))
    stats: dict[str, int] = {}
    assert len(read_conversations(str(path), skip_bad=True, stats=stats)) == 2 and stats["skipped"] == 1
    # nested just under the parser's limit: it loads, and fails while being described
    shallow = [{"role": "user", "content": "x"}, json.loads("[" * 900 + "]" * 900)]
    stats = {}
    out = render_all([("conv.jsonl:7", shallow), ("conv.jsonl:8", good["messages"])], ChatTemplate.gpt2(), 64,
                     skip_bad=True, stats=stats)
    assert len(out) == 1 and stats["skipped"] == 1


def test_shortening_max_steps_on_resume_is_not_called_extending(tmp_path):
    from gptforge.run.resume import resume_notice

    saved = tiny_config(tmp_path, tmp_path / "run", max_steps=100)
    shorter = tiny_config(tmp_path, tmp_path / "run", max_steps=60)
    longer = tiny_config(tmp_path, tmp_path / "run", max_steps=200)
    where = tmp_path / "run" / "checkpoints" / "step_000050"
    assert resume_notice(saved, shorter, 50, where)[1].startswith("shortening the run from train.max_steps 100 to 60")
    assert "compressed" in resume_notice(saved, shorter, 50, where)[1]
    assert resume_notice(saved, longer, 50, where)[1].startswith("extending the run")


@pytest.mark.parametrize("argv", [
    ["prepare", "conversations", "compare", "--n", "2", "--out", "{dir}"],
    ["prepare", "preferences", "compare", "--n", "2", "--out", "{dir}"],
    ["prepare", "preferences", "compare", "--n", "2", "--out", "{file}/under_a_file.jsonl"],
    ["prepare", "conversations", "arithmetic", "--n", "2", "--out", "{file}/x.jsonl"],
])
def test_an_output_path_of_the_wrong_kind_is_one_line_for_every_command(argv, tmp_path, capsys):
    """The class, at main's one handler: a file path that is a folder, or lies under a file, is refused
    naming the path (exit 2), whichever command writes it."""
    (tmp_path / "f").write_text("x")
    argv = [a.format(dir=tmp_path, file=tmp_path / "f") for a in argv]
    _one_line(capsys, argv, str(tmp_path))


def test_serve_on_a_busy_port_refuses_before_its_url_with_its_own_exit(capsys, monkeypatch):
    """Issue 34: a port in use is one line naming it and what to do, exit 4 (not 3, which means
    divergence), before the model loads or the URL is printed."""
    import socket

    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    import gptforge.cli.model as cli_model
    from gptforge.cli.common import EXIT_PORT_BUSY

    monkeypatch.setattr(cli_model, "load", lambda *a, **k: pytest.fail("the model loaded on a busy port"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["serve", "--random", "d2", "--port", str(port)]) == EXIT_PORT_BUSY == 4
    out, err = capsys.readouterr()
    assert "http://" not in out + err and "Errno" not in err
    assert len(err.strip().splitlines()) == 1 and f"port {port}" in err and f"--port {port + 1}" in err
