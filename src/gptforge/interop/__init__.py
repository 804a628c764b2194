"""Moving weights to and from other formats: Hugging Face (``hf_folder.py`` shared by
``hf.py``, ``hf_llama.py``, ``hf_chat.py``)
and llm.c (``llmc.py``).

    gptforge export hf --ckpt runs/shakespeare-cpu --out exports/hf
"""

from __future__ import annotations


def hf_module(arch: str):
    """The module holding a family's Hugging Face ``load_hf(name_or_dir)`` and ``export_hf(model, out,
    force, tokenizer)`` (models know nothing of Hugging Face; this table is where a family plugs in)."""
    from gptforge.interop import hf, hf_llama

    modules = {"gpt2": hf, "llama": hf_llama}
    if arch not in modules:
        raise ValueError(f"model.arch={arch} has no Hugging Face format in gptforge")
    return modules[arch]
