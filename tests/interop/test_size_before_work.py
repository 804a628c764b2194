"""Issue 56 class 1: size before work, in every reader of a model. Each reader (Hugging Face GPT-2, Llama
and Qwen2 directories, GGUF llama and gpt2 files, llm.c files, a checkpoint's meta.json) is given a header
or config that claims far more layers than its weights hold: it must refuse in one line, exit 2, naming
the file, without building a table or model of the claimed size (a spy fails the test if any shape table
or model is made for more layers than the weights hold). Each is then given honest weights on a machine
with (pretend) 1 KB free: refused as a ResourceError before any tensor is read. The claimed and present
parameter counts in the refusal are checked against hand counts of each family's tensors."""

from __future__ import annotations

import json
import math
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from gptforge.cli import main
from gptforge.sizecheck import layered_elements

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

LIE = 10**6  # claimed layers over 2 present (GGUF's own bound is 1,024 layers: it claims 1,000)
V, C, P, FF, H, KV = 64, 32, 32, 64, 4, 2  # vocab, width, positions, MLP width, heads, key/value heads
HD = C // H


# --- hand counts (each family's tensors written out, independent of the readers' tables) -----------------

def gpt2_count(L: int, V: int = V, C: int = C, P: int = P) -> int:
    """wte, wpe, ln_f (w, b); per block: 2 LayerNorms (w, b), c_attn (C x 3C + 3C), c_proj (C x C + C),
    c_fc (C x 4C + 4C), mlp.c_proj (4C x C + C); the head tied."""
    return V * C + P * C + 2 * C + L * (4 * C + 3 * C * C + 3 * C + C * C + C + 4 * C * C + 4 * C + 4 * C * C + C)


def llama_count(L: int, qkv_bias: bool = False, tied: bool = False) -> int:
    """embed (V x C), an untied head (V x C), the final RMSNorm; per block: 2 RMSNorms, q and o (C x C),
    k and v (KV*HD x C) (+ their biases for Qwen2), gate/up/down (3 x C x FF)."""
    per = 2 * C + 2 * C * C + 2 * KV * HD * C + 3 * C * FF + ((C + 2 * KV * HD) if qkv_bias else 0)
    return V * C * (1 if tied else 2) + C + L * per


def test_layered_elements_is_the_sum_of_the_full_table():
    """The closed form from 1- and 2-layer tables equals the sum over a 7-layer table built in full."""
    from gptforge.interop.hf import gpt2_shapes

    cfg = {"n_layer": 7, "n_head": 2, "n_embd": 16, "n_positions": 32, "vocab_size": 300}
    full = sum(math.prod(s) for s in gpt2_shapes(cfg).values())
    assert layered_elements(lambda k: gpt2_shapes(cfg | {"n_layer": k}), 7) == full == gpt2_count(7, 300, 16, 32)


# --- the model sources, each written by its reference writer ---------------------------------------------

def _hf(tmp: Path, kind: str) -> Path:
    torch.manual_seed(0)
    if kind == "gpt2":
        m = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_head=2, n_embd=C, n_positions=P,
                                                                 vocab_size=V))
    else:
        cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
               "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[kind]
        m = cls[1](cls[0](vocab_size=V, hidden_size=C, intermediate_size=FF, num_hidden_layers=2, num_attention_heads=H,
                          num_key_value_heads=KV, max_position_embeddings=P, tie_word_embeddings=False))
    m.save_pretrained(tmp / kind)
    return tmp / kind


def _gguf_llama(tmp: Path) -> Path:
    from tests.interop.test_gguf_read import tiny_llama, write_gguf

    return write_gguf(tmp / "llama.gguf", tiny_llama())


def _gguf_gpt2(tmp: Path) -> Path:
    from tests.interop.test_gguf_gpt2_read import _checkpoint

    ck = _checkpoint(tmp / "ck")
    assert main(["export", "gguf", "--ckpt", str(ck), "--out", str(tmp / "g"), "--dtype", "f32"]) == 0
    return tmp / "g" / "model-f32.gguf"


def _llmc(tmp: Path) -> Path:
    from gptforge.interop.llmc import write_llmc_model
    from gptforge.models.gpt2 import GPT, GPTConfig

    torch.manual_seed(0)
    write_llmc_model(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=C, block_size=P, vocab_size=V)), tmp / "m.bin")
    return tmp / "m.bin"


def _ckpt(tmp: Path) -> Path:
    from gptforge.config import Config
    from gptforge.models.gpt2 import GPT, GPTConfig
    from gptforge.run import checkpoint as ckpt

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=C, block_size=P, vocab_size=V)
    return ckpt.save_checkpoint(tmp / "run", 1, GPT(cfg), None, {"config": Config(model=cfg).to_dict()})


def _set_json(path: Path, keys: list[str], value) -> None:
    d = json.loads(path.read_text())
    node = d
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value
    path.write_text(json.dumps(d))


def _lie_gguf(src: Path, arch: str) -> Path:
    from tests.interop.test_gguf_read import rewrite_gguf

    return rewrite_gguf(src, src.with_name("lie.gguf"), f"{arch}.block_count", 1000, gguf.GGUFValueType.UINT32)


def _lie_llmc(src: Path) -> Path:
    raw = bytearray(src.read_bytes())
    raw[16:20] = np.array([LIE], dtype="<i4").tobytes()  # header int 4: L
    src.write_bytes(bytes(raw))
    return src


# reader -> (make honest input, make it lie, flag, claimed parameters by hand, present by hand)
READERS = {
    "hf-gpt2": (lambda t: _hf(t, "gpt2"), lambda p: _set_json(p / "config.json", ["n_layer"], LIE) or p, "--hf",
                gpt2_count(LIE), gpt2_count(2)),  # save_pretrained stores the tied head once
    "hf-llama": (lambda t: _hf(t, "llama"), lambda p: _set_json(p / "config.json", ["num_hidden_layers"], LIE) or p,
                 "--hf", llama_count(LIE), llama_count(2)),
    "hf-qwen2": (lambda t: _hf(t, "qwen2"),  # its layer_types, one per layer, would name the lie before the size
                 lambda p: _set_json(p / "config.json", ["layer_types"], None)
                 or _set_json(p / "config.json", ["num_hidden_layers"], LIE) or p, "--hf", llama_count(LIE, qkv_bias=True), llama_count(2, qkv_bias=True)),
    "gguf-llama": (_gguf_llama, lambda p: _lie_gguf(p, "llama"), "--gguf", None, None),
    "gguf-gpt2": (_gguf_gpt2, lambda p: _lie_gguf(p, "gpt2"), "--gguf", None, None),
    "llmc": (_llmc, _lie_llmc, "--llmc", None, None),
    "meta.json": (_ckpt, lambda p: _set_json(p / "meta.json", ["config", "model", "n_layer"], LIE) or p, "--ckpt",
                  None, None),
}


@pytest.fixture
def no_work_past_the_weights(monkeypatch):
    """Any shape table or model made for more than the 2 layers the weights hold fails the test; so does
    anything still running after 300 s: a backstop for a hang only (the GPT-2 reader took 44 s on 10^6 claimed
    layers before, and gave no answer in 300 s); the spies are the check, as wall time on a shared 2-core
    machine says little (60 s ran out here at load 10 with the fix in place)."""
    import gptforge.interop.gguf_read as gr
    import gptforge.interop.hf as hf
    import gptforge.interop.hf_llama as hl
    import gptforge.models.registry as reg

    def guard(fn, n_layer_of):
        def spy(cfg, *a, **kw):
            assert n_layer_of(cfg) <= 2, f"{fn.__name__} built for {n_layer_of(cfg)} claimed layers"
            return fn(cfg, *a, **kw)
        return spy

    monkeypatch.setattr(hf, "gpt2_shapes", guard(hf.gpt2_shapes, lambda c: c["n_layer"]))
    monkeypatch.setattr(hl, "_hf_shapes", guard(hl._hf_shapes, lambda c: c.n_layer))
    monkeypatch.setattr(gr, "_expected_shapes", guard(gr._expected_shapes, lambda c: c.n_layer))
    monkeypatch.setattr(gr, "_gpt2_expected_shapes", guard(gr._gpt2_expected_shapes, lambda c: c.n_layer))
    monkeypatch.setattr(reg, "build_model", guard(reg.build_model, lambda c: c.n_layer))

    def too_slow(*_):
        raise AssertionError("still working 300 s after a config that claims more layers than its weights hold")

    old = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(300)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("reader", list(READERS))
def test_a_claim_past_the_weights_is_refused_before_any_per_layer_work(reader, tmp_path, capsys,
                                                                       no_work_past_the_weights):
    make, lie, flag, claimed, present = READERS[reader]
    src = lie(make(tmp_path))
    capsys.readouterr()
    assert main(["sample", flag, str(src), "--max-new-tokens", "1", "--device", "cpu"]) == 2
    err = _one_line(capsys)
    assert str(src) in err, err
    if claimed is not None:  # the shared check's own words: both counts, each as a hand count gives it
        assert f"implies {claimed:,} parameters in {LIE:,} layers, the weights hold {present:,} in 2" in err, err


@pytest.mark.parametrize("reader", list(READERS))
def test_a_model_larger_than_free_memory_is_refused_before_a_tensor_is_read(reader, tmp_path, capsys, monkeypatch):
    from gptforge import resources

    src = READERS[reader][0](tmp_path)
    monkeypatch.setattr(resources, "free_memory", lambda: resources.FreeMemory(1024))  # honest weights, 1 KB free
    capsys.readouterr()
    assert main(["sample", READERS[reader][2], str(src), "--max-new-tokens", "1", "--device", "cpu"]) == 2
    err = _one_line(capsys)
    assert "GiB free" in err and "0.0 GiB free" in err, err


@pytest.mark.parametrize("reader", list(READERS))
def test_honest_weights_still_load(reader, tmp_path):
    """The checks refuse only lies: every honest source loads (the readers' logits are tested elsewhere)."""
    from gptforge.load import ModelSource, load_model

    src = READERS[reader][0](tmp_path)
    kind = READERS[reader][2].removeprefix("--")
    model = load_model(ModelSource(**{kind: str(src)}))
    assert model.config.n_layer == 2


def test_a_safetensors_header_cannot_claim_more_elements_than_its_bytes(tmp_path):
    """The present count comes from headers: an entry whose shape outgrows its byte range is refused by name."""
    from gptforge.errors import CheckpointError
    from gptforge.run.weights import weights_header

    path = _hf(tmp_path, "gpt2") / "model.safetensors"
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["shape"] = [10**6] + header[name]["shape"][1:]
    body = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(body) == n
    path.write_bytes(raw[:8] + body + raw[8 + n:])
    with pytest.raises(CheckpointError, match=f"header entry '{name}' has no valid dtype, shape and byte range"):
        weights_header(path)
    shutil.rmtree(path.parent)
