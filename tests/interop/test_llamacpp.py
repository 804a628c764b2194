"""llama.cpp itself (through ``llama-cpp-python``, which compiles it) loads ``export gguf`` files of
both families and produces gptforge's greedy tokens, logits and tokenization.

Its own lane: ``pip install 'gptforge[llamacpp]'`` builds llama.cpp from source (tens of minutes on
two cores), so CI skips these tests (the marker ``llamacpp`` lets strict mode allow the skip):

    pip install 'gptforge[llamacpp]' && pytest -m llamacpp tests/interop/test_llamacpp.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gptforge.cli import main
from gptforge.config import Config
from gptforge.data.chat import ChatTemplate, ChatTokenizer
from gptforge.generation import SamplingParams, complete, stream_tokens
from gptforge.models.gpt2 import GPT, GPTConfig
from gptforge.models.llama import Llama, LlamaConfig
from gptforge.run.checkpoint import save_checkpoint

pytestmark = pytest.mark.llamacpp
T = ChatTemplate.gpt2()
PROMPT = "Hello, I'm a language model, and"
N_NEW = 24


def _peaked(m: torch.nn.Module) -> torch.nn.Module:
    """Random weights large enough that the greedy choice is never a near-tie (float32 vs ggml's sums)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.1 if p.dim() == 1 else 0.3) + (p.dim() == 1) * 1.0)
    return m.eval()


MODELS = {
    "gpt2": lambda: _peaked(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=128))),
    "llama-chat": lambda: _peaked(Llama(LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, block_size=128,
                                                    vocab_size=T.vocab_size))),
}


@pytest.fixture(scope="module", params=list(MODELS))
def exported(request, tmp_path_factory):
    llama_cpp = pytest.importorskip("llama_cpp")
    torch.manual_seed(0)
    model = MODELS[request.param]()
    chat = request.param.endswith("chat")
    meta = {"config": Config(model=model.config).to_dict(), **({"chat_template": T.to_dict()} if chat else {})}
    root = tmp_path_factory.mktemp(request.param)
    ck = save_checkpoint(root / "run", 1, model, None, meta)
    assert main(["export", "gguf", "--ckpt", str(ck), "--out", str(root / "gguf")]) == 0
    # KV cache in float32 (llama.cpp's default is float16, ~1e-3 off): the logits can then be compared tightly
    llm = llama_cpp.Llama(model_path=str(root / "gguf" / "model-f32.gguf"), n_ctx=128, n_threads=1, logits_all=True,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, verbose=False)
    return model, llm, chat


def test_tokenizer_matches_tiktoken(exported, tokenizer):
    _, llm, chat = exported
    for text in (PROMPT, "  two spaces,\ttabs\nand ünïcödé — 1234 'quotes' don't"):
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == tokenizer.encode_ordinary(text)
    if chat:
        assert llm.tokenize(b"<|user|>Hi<|end|>", add_bos=False, special=True) == [T.roles["user"], 17250, T.end]


def test_greedy_tokens_and_logits_match(exported, tokenizer):
    model, llm, _ = exported
    ids = tokenizer.encode_ordinary(PROMPT)
    ours = [t.item() for t in stream_tokens(model, [ids], SamplingParams(max_new_tokens=N_NEW, temperature=0))]
    llm.reset()
    theirs = []
    for tok in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        theirs.append(tok)
        if len(theirs) == N_NEW:
            break
    assert theirs == ours
    llm.reset()
    llm.eval(ids)
    with torch.no_grad():
        ref = model(torch.tensor([ids]))[0][0, :, : model.config.vocab_size].numpy()
    got = np.asarray(llm.scores[: len(ids)])
    # ggml's CPU GELU reads a float16 table (GGML_GELU_FP16): gpt2 agrees to ~2e-4 of the logits' range
    tol = 1e-3 if isinstance(model, GPT) else 1e-4
    assert np.abs(got - ref).max() < tol * max(1.0, np.abs(ref).max())


def test_chat_template_reply_matches(exported, tokenizer):
    model, llm, chat = exported
    if not chat:  # a base model's file carries no template for llama.cpp to find
        assert "tokenizer.chat_template" not in llm.metadata and llm.metadata["tokenizer.ggml.eos_token_id"] == "50256"
        return
    assert llm.metadata["tokenizer.chat_template"] == T.jinja()
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    ref = complete(model, ChatTokenizer(tokenizer, T), [T.render_for_generation(msgs, tokenizer)],
                   SamplingParams(max_new_tokens=12, temperature=0, stop_token=T.end))[0]["text"]
    llm.reset()
    r = llm.create_chat_completion(messages=msgs, temperature=0.0, top_k=1, max_tokens=12, repeat_penalty=1.0)
    assert r["choices"][0]["message"]["content"] == ref
