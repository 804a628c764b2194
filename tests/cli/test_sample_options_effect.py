"""Every option of ``gptforge sample`` tested through to its effect (issue 36), with a walk over the CLI
table's own parser so a new flag without an effect test fails. Greedy outputs are compared with a greedy
decoder written out here (a forward over the whole sequence per step, the repetition penalty by hand,
float64); sampled ones with ``generation.complete`` given the options by hand and the same seed.

Planted bugs these catch: --top-p or --top-k not passed to the sampler, --stop dropped, --seed ignored,
--repetition-penalty ignored, --stop-at-eot ignored, --num-samples not honoured."""

from __future__ import annotations

import pytest
import torch

from gptforge.cli import main
from gptforge.config import Config
from gptforge.generation import SamplingParams, complete
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.run.checkpoint import save_checkpoint

EOT = 50256
PROMPT = "ROMEO: shall I"


def _model(eot_first: bool = False) -> GPT:
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64)).eval()
    with torch.no_grad():
        m.transformer.wte.weight.mul_(5)  # sharper than at init: every knob changes the draws
        if eot_first:  # ln_f's output is its bias alone, and <|endoftext|> points along it: greedy picks it
            m.transformer.ln_f.weight.zero_()
            m.transformer.ln_f.bias.copy_(torch.randn(32))
            m.transformer.wte.weight[EOT] = m.transformer.ln_f.bias * 10
    return m


def _ckpt(tmp, model) -> str:
    return str(save_checkpoint(tmp / "run", 1, model, None, {"config": Config(model=model.config).to_dict()}))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    m = _model()
    return m, _ckpt(tmp_path_factory.mktemp("sample"), m)


def sample(capsys, ck, *args) -> list[str]:
    """The samples' texts after their prompts."""
    assert main(["sample", "--ckpt", ck, "--device", "cpu", "--prompt", PROMPT, *args]) == 0
    out = capsys.readouterr().out
    blocks = [b.split("\n", 1)[1].rstrip("\n") for b in out.split("--- sample ")[1:]]
    assert all(b.startswith(PROMPT) for b in blocks)
    return [b[len(PROMPT):] for b in blocks]


@torch.no_grad()
def greedy(model, tok, n, rep=1.0, stop_token=None) -> str:
    seq = tok.encode(PROMPT)
    out = []
    for _ in range(n):
        logits, _ = model(torch.tensor([seq]))
        z = logits[0, -1].double().clone()
        if rep != 1.0:
            for t in set(seq):
                z[t] = z[t] * rep if z[t] < 0 else z[t] / rep
        nxt = int(z.argmax())
        seq.append(nxt)
        if nxt == stop_token:
            break
        out.append(nxt)
    return b"".join(tok.decode_single_token_bytes(t) for t in out).decode("utf-8", "replace")


def lib(model, tok, n, rows=1, **kw) -> list[str]:
    p = SamplingParams(max_new_tokens=n, **kw)
    return [c["text"] for c in complete(model, tok, [PROMPT] * rows, p)]


def test_prompt_max_new_tokens_and_temperature_zero(run, capsys, tokenizer):
    model, ck = run
    for n in (1, 6):
        assert sample(capsys, ck, "--max-new-tokens", str(n), "--temperature", "0") == [greedy(model, tokenizer, n)]


def test_top_p_and_top_k(run, capsys, tokenizer):
    model, ck = run
    g = greedy(model, tokenizer, 6)
    assert sample(capsys, ck, "--max-new-tokens", "6", "--num-samples", "1", "--top-p", "1e-6", "--top-k", "0") == [g]
    assert sample(capsys, ck, "--max-new-tokens", "6", "--num-samples", "1", "--top-k", "1") == [g]
    half = sample(capsys, ck, "--max-new-tokens", "6", "--num-samples", "2", "--top-p", "0.5", "--top-k", "0",
                  "--temperature", "1.5", "--seed", "3")
    assert half == lib(model, tokenizer, 6, rows=2, temperature=1.5, top_k=None, top_p=0.5, seed=3)
    assert half != lib(model, tokenizer, 6, rows=2, temperature=1.5, top_k=None, seed=3)
    k3 = sample(capsys, ck, "--max-new-tokens", "6", "--num-samples", "2", "--top-k", "3", "--temperature", "1.5",
                "--seed", "3")
    assert k3 == lib(model, tokenizer, 6, rows=2, temperature=1.5, top_k=3, seed=3) and k3 != half


def test_seed_num_samples_temperature(run, capsys, tokenizer):
    model, ck = run
    a = sample(capsys, ck, "--max-new-tokens", "6", "--num-samples", "3", "--temperature", "1.2", "--seed", "7")
    assert a == lib(model, tokenizer, 6, rows=3, temperature=1.2, top_k=50, seed=7)
    assert len(set(a)) == 3
    b = sample(capsys, ck, "--max-new-tokens", "6", "--num-samples", "3", "--temperature", "1.2", "--seed", "8")
    c = sample(capsys, ck, "--max-new-tokens", "6", "--num-samples", "3", "--temperature", "0.6", "--seed", "7")
    assert b == lib(model, tokenizer, 6, rows=3, temperature=1.2, top_k=50, seed=8) and b != a
    assert c == lib(model, tokenizer, 6, rows=3, temperature=0.6, top_k=50, seed=7) and c != a


def test_repetition_penalty(run, capsys, tokenizer):
    model, ck = run
    got = sample(capsys, ck, "--max-new-tokens", "10", "--temperature", "0", "--repetition-penalty", "3")
    assert got == [greedy(model, tokenizer, 10, rep=3.0)] and got != [greedy(model, tokenizer, 10)]


def test_stop(run, capsys, tokenizer):
    model, ck = run
    full = greedy(model, tokenizer, 12)
    stop = full[5:8]
    assert stop and full.index(stop) >= 1
    assert sample(capsys, ck, "--max-new-tokens", "12", "--temperature", "0", "--stop", stop) == \
        [full[: full.index(stop)]]
    assert sample(capsys, ck, "--max-new-tokens", "12", "--temperature", "0", "--stop", "zzqq", "--stop", stop) == \
        [full[: full.index(stop)]]


def test_stop_at_eot(tmp_path, capsys):
    ck = _ckpt(tmp_path, _model(eot_first=True))
    assert sample(capsys, ck, "--max-new-tokens", "3", "--temperature", "0") == ["<|endoftext|>" * 3]
    assert sample(capsys, ck, "--max-new-tokens", "3", "--temperature", "0", "--stop-at-eot") == [""]


def test_device_places_the_model(run, capsys):
    """--device: where the model runs; "cpu" runs, a device this machine lacks is refused by name."""
    _, ck = run
    assert sample(capsys, ck, "--max-new-tokens", "2", "--temperature", "0")
    if not torch.cuda.is_available():
        assert main(["sample", "--ckpt", ck, "--device", "cuda", "--max-new-tokens", "2"]) != 0


# every option of `gptforge sample`: its effect test here, or where the option's effect is tested
EFFECTS = {
    "--prompt": "test_prompt_max_new_tokens_and_temperature_zero",
    "--max-new-tokens": "test_prompt_max_new_tokens_and_temperature_zero",
    "--temperature": "test_seed_num_samples_temperature",
    "--top-k": "test_top_p_and_top_k",
    "--top-p": "test_top_p_and_top_k",
    "--num-samples": "test_seed_num_samples_temperature",
    "--seed": "test_seed_num_samples_temperature",
    "--repetition-penalty": "test_repetition_penalty",
    "--stop": "test_stop",
    "--stop-at-eot": "test_stop_at_eot",
    "--device": "test_device_places_the_model",
    "--ckpt": "test_prompt_max_new_tokens_and_temperature_zero",
}
# the model sources: which weights are loaded (their loaders' own tests compare the loaded model's logits)
ELSEWHERE = {
    "--hf": "tests/interop/test_hf_gpt2_configs.py",
    "--llmc": "tests/interop/test_interop.py",
    "--random": "tests/models/test_registry.py",
    "--gguf": "tests/cli/test_own_tokenizer.py",  # test_a_gguf_file_is_a_model_source_everywhere: sample --gguf
}


def test_every_sample_option_has_an_effect_test():
    from pathlib import Path

    from tests.training.commands import subparsers

    parser = subparsers()["sample"]
    flags = {max(a.option_strings, key=len) for a in parser._actions if a.option_strings and a.dest != "help"}
    missing = flags - set(EFFECTS) - set(ELSEWHERE)
    assert not missing, f"`gptforge sample` options with no effect test (add one and an EFFECTS entry): {missing}"
    assert set(EFFECTS) | set(ELSEWHERE) <= flags
    for test in EFFECTS.values():
        assert callable(globals().get(test)), test
    root = Path(__file__).resolve().parents[2]
    for flag, where in ELSEWHERE.items():
        assert flag in (root / where).read_text(), (flag, where)
