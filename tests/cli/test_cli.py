"""The command line: bad input exits 2 before compute; presets validate; the end-to-end path works."""

import json
import subprocess
import sys

import pytest

from gptforge.cli import main
from gptforge.config import Config, ConfigError, apply_overrides
from gptforge.presets import PRESETS, get_preset


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_validates(name):
    cfg = get_preset(name)
    cfg.validate()
    assert Config.from_dict(json.loads(cfg.to_json())) == cfg  # round-trips through JSON


def test_fineweb_preset_has_llmc_hyperparameters():
    cfg = get_preset("gpt2-124m-fineweb10b")
    assert (cfg.train.micro_batch, cfg.train.seq_len, cfg.train.total_batch_tokens) == (64, 1024, 524_288)
    assert (cfg.optim.lr, cfg.optim.warmup_steps, cfg.train.max_steps) == (6e-4, 700, 18_865)
    assert cfg.train.grad_accum(world=8) == 1 and cfg.train.grad_accum(world=1) == 8
    assert cfg.model.n_layer == 12 and cfg.model.padded_vocab_size == 50304


def test_overrides_parse_types():
    cfg = apply_overrides(get_preset("tiny"), ["--optim.lr", "3e-4", "--train.compile=auto", "--model.flash", "off",
                                               "--train.max_steps", "1e3", "--train.dtype", "bfloat16"])
    assert cfg.optim.lr == 3e-4 and cfg.train.compile is None and cfg.model.flash is False
    assert cfg.train.max_steps == 1000 and cfg.train.dtype == "bfloat16"


@pytest.mark.parametrize(
    "args, words",
    [
        (["--optim.lrr", "1"], "unknown config key --optim.lrr; did you mean --optim.lr"),
        (["--optim.lr", "fast"], "--optim.lr 'fast': expected a finite number"),
        (["--optim.lr", "-1"], "optim.lr=-1.0 is not allowed"),
        (["--train.dtype", "fp8"], "allowed values are auto, float32, bfloat16"),
        (["--model.flash", "maybe"], "expected a boolean"),
        (["--model.n_head", "5"], "divisible"),
    ],
)
def test_bad_overrides_name_key_and_allowed(args, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        apply_overrides(get_preset("tiny"), args)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["train", "--preset", "tiny", "--optim.lrr", "1"], "unknown config key"),
        (["train", "--preset", "nope"], "unknown preset 'nope'"),
        (["train", "--preset", "tiny", "--train.micro_batch", "3"], "not divisible"),
        (["train", "--preset", "tiny", "--data.dir", "/nonexistent"], "/nonexistent"),
        (["sample", "--ckpt", "/nonexistent"], "/nonexistent"),
        (["sample"], "exactly one of --ckpt"),
    ],
)
def test_cli_bad_input_exits_2(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert words in capsys.readouterr().err


def test_train_help_and_config_listing(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    assert "--optim.lr" in out and "--train.total_batch_tokens" in out


def test_module_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "gptforge", "presets"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "gpt2-124m-fineweb10b" in r.stdout


def test_train_then_sample_end_to_end(shard_dir, tmp_path, tokenizer, capsys):
    out = tmp_path / "run"
    argv = ["train", "--preset", "tiny", "--data.dir", str(shard_dir), "--out", str(out), "--train.max_steps", "4",
            "--model.vocab_size", "50257", "--train.device", "cpu"]
    assert main(argv) == 0
    args = ["sample", "--ckpt", str(out), "--prompt", "Hello", "--num-samples", "2", "--max-new-tokens", "5",
            "--seed", "7", "--device", "cpu"]
    capsys.readouterr()
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first  # reproducible for a given seed
    assert first.count("--- sample") == 2 and first.count("Hello") == 2
    # a prompt that does not fit the context is refused with a clear message
    longer = list(args)  # the same command with --max-new-tokens 500 (a flag given twice is refused)
    longer[longer.index("--max-new-tokens") + 1] = "500"
    assert main(longer) == 2


def test_top_level_help_imports_no_torch():
    import subprocess

    code = ("import sys\nfrom gptforge.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('TORCH', 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "train" in out and "TORCH False" in out, out


def test_prepare_imports_no_torch_and_later_errors_still_exit_2(tokenizer, tmp_path):
    """prepare needs no torch (issue 35: importing it was ~190 of prepare's ~270 MiB peak RSS); the bad-input
    errors of torch-side modules are still caught once a command has imported them (exit 2, one line)."""
    import subprocess

    (tmp_path / "a.txt").write_text("To be, or not to be, that is the question.\n" * 200)
    code = ("import sys\nfrom gptforge.cli import main\n"
            f"rc = main(['prepare', 'files', {str(tmp_path / 'a.txt')!r}, '--out', {str(tmp_path / 'o')!r}, "
            "'--workers', '1', '--val-tokens', '0', '--no-progress'])\n"
            "print('PREPARE', rc, 'TORCH', 'torch' in sys.modules)\n"
            "print('TRAIN', main(['train', '--preset', 'tiny', '--train.no_such_key', '1']))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "PREPARE 0 TORCH False" in r.stdout, (r.stdout, r.stderr)
    assert list((tmp_path / "o").glob("*.bin")), "prepare wrote no shard"
    assert "TRAIN 2" in r.stdout and "unknown config key --train.no_such_key" in r.stderr, (r.stdout, r.stderr)


@pytest.mark.parametrize("command, flags", [
    ("sample", ["--max-new-tokens", "--temperature", "--top-k", "--seed", "--num-samples"]),
    ("chat", ["--temperature", "--top-k", "--repetition-penalty", "--device"]),
])
def test_sample_and_chat_help_show_defaults(command, flags, capsys, monkeypatch):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    lines = capsys.readouterr().out.splitlines()
    for flag in flags:
        i = next(i for i, ln in enumerate(lines) if ln.strip().startswith(flag + " "))
        assert "default" in " ".join(lines[i : i + 2]), lines[i : i + 2]  # the help may start on the next line


def test_presets_list_whole_sentences(capsys):
    from gptforge.cli.data import first_sentence
    from gptforge.presets import PRESETS

    assert main(["presets"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for name, fn in PRESETS.items():
        sentence = first_sentence(fn.__doc__)
        assert sentence.endswith((".", ")", "`")) and " ".join(sentence.split()) in out, name
