"""Every optional dependency is checked by one helper: a missing package ends in one line naming the
extra to install and exit status 2, before any compute (the package is made unimportable with
sys.modules[name] = None, which is what a missing install looks like to `import`)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from gptforge.cli import main
from gptforge.extras import EXTRAS, NOT_IN_DEV, MissingExtra, require

ROOT = Path(__file__).resolve().parents[1]


def _argv(tmp: Path, *args: str) -> list[str]:
    return [a.format(tmp=tmp) for a in args]


CASES = [  # (module made missing, extra named, command line)
    ("fastapi", "serve", ("serve", "--ckpt", "{tmp}/run")),
    ("uvicorn", "serve", ("serve", "--ckpt", "{tmp}/run")),
    ("matplotlib", "plot", ("plot", "{tmp}", "--image", "{tmp}/c.png")),
    ("pyarrow", "eval", ("assets", "evals")),
    ("datasets", "data", ("assets", "evals", "--online")),
    ("pyarrow", "data", ("prepare", "files", "{tmp}/c.parquet", "--out", "{tmp}/o", "--no-progress")),
    ("datasets", "data", ("prepare", "fineweb", "--data-files", "{tmp}/c.parquet", "--out", "{tmp}/o")),
    ("transformers", "hf", ("sample", "--hf", "gpt2", "--num-samples", "1")),  # a hub name; a local folder needs none
    ("transformers", "hf", ("eval", "--hf", "gpt2", "--tasks", "hellaswag")),
    ("transformers", "hf", ("export", "hf", "--hf", "openai-community/gpt2", "--out", "{tmp}/x")),
    ("gguf", "gguf", ("export", "gguf", "--random", "d2", "--out", "{tmp}/x")),
    ("transformers", "hf", ("bench-generate", "--size", "d2", "--batch", "1", "--new-tokens", "1")),
    ("pyarrow", "data", ("bench-prepare", "--workers", "1")),
    ("tensorboard", "tensorboard", ("train", "--preset", "tiny", "--data.dir", "{tmp}/data", "--out", "{tmp}/r",
                                    "--model.vocab_size", "512", "--train.log_to", "tensorboard")),
]


@pytest.mark.parametrize(("module", "extra", "args"), CASES, ids=[f"{c[2][0]}-{c[0]}" for c in CASES])
def test_missing_extra_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, module, extra, args):
    if args[0] == "assets":
        monkeypatch.setenv("GPTFORGE_CACHE", str(tmp_path / "cache"))  # nothing cached yet: it would download
    (tmp_path / "c.parquet").write_bytes(b"PAR1")
    (tmp_path / "hfdir").mkdir()
    if args[0] == "train":
        from tests.conftest import make_shards

        make_shards(tmp_path / "data")
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)
    assert main(_argv(tmp_path, *args)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"needs {module}" in err and f"pip install 'gptforge[{extra}]'" in err, err
    assert err.startswith(f"gptforge {args[0]}: error:")


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_local_hugging_face_folder_needs_no_transformers(tmp_path, monkeypatch, capsys, arch):
    """A save_pretrained folder is read with safetensors alone (config.json, then the weights' header): the
    docs say so and the loaders do it, but every --hf load asked for the hf extra first. Without transformers,
    sample and export take the folder of either family; only a hub name needs the extra (CASES above)."""
    from gptforge.config import Config
    from gptforge.models.registry import get_family, size_config
    from gptforge.run import checkpoint as ckpt

    model_cfg = size_config("d2" if arch == "gpt2" else "llama-tiny", block_size=64)
    ckpt.save_checkpoint(tmp_path / "run", 1, get_family(arch).model_cls(model_cfg), None,
                         {"config": Config(model=model_cfg).to_dict()})
    assert main(["export", "hf", "--ckpt", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    for name in [m for m in sys.modules if m == "transformers" or m.startswith("transformers.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "transformers", None)
    capsys.readouterr()
    assert main(["sample", "--hf", str(tmp_path / "hf"), "--num-samples", "1", "--max-new-tokens", "2"]) == 0
    assert main(["export", "hf", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "again")]) == 0
    assert "needs transformers" not in capsys.readouterr().err


def test_require_returns_the_module_and_names_the_extra(monkeypatch):
    import json

    assert require("json", extra="hf", for_what="x") is json
    monkeypatch.setitem(sys.modules, "somepkg", None)
    with pytest.raises(MissingExtra, match=r"^gptforge thing needs somepkg, .*pip install 'gptforge\[plot\]'"):
        require("somepkg.sub", extra="plot", for_what="gptforge thing")
    with pytest.raises(ValueError, match="unknown extra"):
        require("json", extra="nope", for_what="x")


def test_extras_match_pyproject_and_dev_installs_them_all():
    """EXTRAS names exactly pyproject's extras, and `dev` (what CI installs) holds every package of them."""
    text = (ROOT / "pyproject.toml").read_text()
    block = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    declared = {m.group(1): re.findall(r'"([A-Za-z0-9_.-]+)', m.group(2))
                for m in re.finditer(r"^(\w+) = \[(.*?)\]", block, re.M | re.S)}
    dev = set(declared.pop("dev"))
    assert set(declared) == set(EXTRAS)
    for extra, pkgs in declared.items():
        if extra not in NOT_IN_DEV:
            assert set(pkgs) <= dev, (extra, set(pkgs) - dev)


OPTIONAL_IN_TESTS = {"fastapi", "uvicorn", "httpx", "pyarrow", "datasets", "matplotlib", "gguf", "trl", "tensorboard",
                     "wandb", "openai", "playwright", "rustbpe", "transformers", "triton", "llama_cpp", "peft"}


def test_no_test_module_imports_an_optional_package_before_skipping_on_it():
    """A test file that imports an optional package at module level, with no importorskip before it, stops the
    whole run's collection on a machine without that package (the GPU device has no fastapi: the GPU lane's
    run of 2026-11-25 ended in a collection error). Each such import must follow its importorskip."""
    import ast
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        skipped: set[str] = set()
        for node in ast.parse(path.read_text()).body:
            call = node.value if isinstance(node, (ast.Expr, ast.Assign)) else None
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "importorskip" and call.args and isinstance(call.args[0], ast.Constant)):
                skipped.add(str(call.args[0].value).split(".")[0])
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                top = name.split(".")[0]
                if top in OPTIONAL_IN_TESTS and top not in skipped:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name} before pytest.importorskip({top!r})")
    assert not bad, "\n".join(bad)
