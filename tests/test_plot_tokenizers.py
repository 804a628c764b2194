"""``gptforge plot`` says when the runs it draws count their losses in different tokenizers (issue 55: a GPT-2
run and a 4,096-token run shared one nats-per-token axis as if comparable). The tokenizer comes from each
run's newest checkpoint (its recorded tokenizer), else its config.json's model.vocab_size."""

from __future__ import annotations

import json

import pytest

from gptforge.cli import main


def _run(folder, vocab: int, tokenizer: dict | None = None):
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"kind": "train", "step": k, "loss": 5.0 - k,
                                                              "tokens": 256 * k}) + "\n" for k in range(1, 4)))
    (folder / "config.json").write_text(json.dumps({"model": {"vocab_size": vocab}, "data": {"dir": "data/x"}}))
    if tokenizer is not None:  # a checkpoint's meta.json: what the run recorded of its tokenizer
        step = folder / "checkpoints" / "step_000003"
        step.mkdir(parents=True)
        (step / "meta.json").write_text(json.dumps({"step": 3, "config": {}, "tokenizer": tokenizer}))
    return str(folder)


@pytest.fixture
def figures(monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    figs, close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (figs.append(fig), close(fig)))
    return figs


def test_runs_of_different_vocabularies_are_said_to_differ(tmp_path, capsys, figures):
    a, b = _run(tmp_path / "gpt2", 50304), _run(tmp_path / "small", 4096)
    assert main(["plot", a, b, "--image", str(tmp_path / "p.png")]) == 0
    err = capsys.readouterr().err
    assert "different tokenizers" in err and "gpt2: a 50,304-token vocabulary" in err and \
        "small: a 4,096-token vocabulary" in err, err
    title = figures[-1].axes[0].get_title()
    assert "different tokenizers" in title and "50,304" in title and "4,096" in title, title


def test_a_recorded_tokenizer_wins_over_the_vocabulary(tmp_path, capsys, figures):
    """Two runs of one 50,304-row model shape, trained on different tokenizers: the checkpoints say so."""
    a = _run(tmp_path / "a", 50304, {"name": "gpt2", "n_vocab": 50257, "fingerprint": "aaa"})
    b = _run(tmp_path / "b", 50304, {"name": "mine", "n_vocab": 50000, "fingerprint": "bbb"})
    assert main(["plot", a, b, "--image", str(tmp_path / "p.png")]) == 0
    err = capsys.readouterr().err
    assert "a: tokenizer 'gpt2' (50,257 ids)" in err and "b: tokenizer 'mine' (50,000 ids)" in err, err


@pytest.mark.parametrize("same", ["vocab", "tokenizer"])
def test_runs_of_one_tokenizer_get_no_note(tmp_path, capsys, figures, same):
    tok = {"name": "gpt2", "n_vocab": 50257, "fingerprint": "aaa"} if same == "tokenizer" else None
    a, b = _run(tmp_path / "a", 50304, tok), _run(tmp_path / "b", 50304 if same == "vocab" else 4096, tok)
    assert main(["plot", a, b, "--image", str(tmp_path / "p.png")]) == 0
    assert "tokenizer" not in capsys.readouterr().err
    assert figures[-1].axes[0].get_title() == "loss vs step"
