"""The commands a finished run suggests next (:func:`next_commands`, from what the run was given: :func:`run_hints`),
and where they write ("next:", "train on them: ..."): always derived from
the paths the user gave (the run's --out, the data file's folder), never a fixed name, so a newcomer who
follows the advice stays inside the journey's own folder and never writes into the repository root or
into another journey's files (issue 55: ``runs/sft``, ``runs/rl_rm``, ``prefs_judged.jsonl`` and
``exports/<run-name>`` collided across journeys). Every command's hints use these helpers, so a new
command inherits them.

    >>> beside("runs/chat/conv.jsonl", "sft")     # the next step goes in the same folder
    'runs/chat/sft'
    >>> export_dir("runs/chat/sft")               # an export mirrors the run's place under exports/
    'exports/chat/sft'
    >>> beside("conv.jsonl", "sft")               # a bare name at the top level: its own folder under runs/
    'runs/conv/sft'
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

# the generated tasks (gptforge.eval.generative.GENERATED, named here so that building a parser imports nothing):
# the choices of the commands that generate or score them, and the tasks a finished SFT run is offered RL on
GENERATED_TASKS = ["arithmetic", "arithmetic3", "compare"]
CHECKPOINTS = "checkpoints"  # a run's checkpoints folder: RUN/checkpoints/step_N (run.checkpoint)


def _path(path: str | Path) -> Path:
    p = Path(path)
    return p.resolve() if p.name in ("", "..") else p  # "." or "..": the folder it names


def run_dir(path: str | Path) -> Path:
    """The run a path names: RUN for RUN/checkpoints/step_N (what --init-from and --ckpt also take)."""
    p = _path(path)
    if p.parent.name == CHECKPOINTS and p.name.startswith("step_"):
        return p.parent.parent
    return p.parent if p.name == CHECKPOINTS else p


def home(path: str | Path) -> Path:
    """The folder what follows ``path`` (a data file or a run) goes in: the folder holding it. A bare name in
    the working directory (``--out conv.jsonl``) gets ``runs/<its stem>``, so a hint never puts a new file
    or run into the repository root, and two such names never share a folder."""
    p = run_dir(path)
    if not p.is_absolute() and p.parent == Path("."):
        return Path("runs") / (p.stem or p.name)
    return p.parent


def beside(path: str | Path, name: str) -> str:
    """``name`` in :func:`home` of ``path``: where the next command writes its file or run (never ``path``
    itself: a run already named ``name`` gets ``<its name>_<name>``)."""
    p = run_dir(path)
    out = home(p) / name
    return str(home(p) / f"{p.stem}_{name}" if out == p else out)


def export_dir(run: str | Path) -> str:
    """Where ``export`` of a run writes: the run's path with its nearest ``runs`` folder read as ``exports``
    (runs/chat/sft -> exports/chat/sft, the guides' layout; .gitignore holds both); a run outside any runs/
    folder gets an ``exports`` folder beside it (a top-level ``myrun``: exports/myrun)."""
    p = run_dir(run)
    parts = p.parts
    above = parts[:-1]
    if "runs" in above:
        i = len(above) - 1 - above[::-1].index("runs")
        return str(Path(*parts[:i], "exports", *parts[i + 1:]))
    return str(p.parent / "exports" / p.name)


def q(path: str | Path) -> str:
    """A path as a shell word: a hinted command pastes and parses as printed, spaces and all. A path with a
    character that does not print (a newline, a tab, a control byte) or a byte that is not UTF-8 (Python holds it
    as a surrogate, which stdout writes as '?' or U+FFFD: a pasted hint named another path, or none) is written in
    bash's $'...' quoting, each such byte as its escape, so the word prints as it reads and means the path's own bytes."""
    s = str(path)
    if s.isprintable():
        return shlex.quote(s)
    out = []
    for ch in s:
        o = ord(ch)
        if 0xDC80 <= o <= 0xDCFF:  # os.fsdecode's surrogateescape: the raw byte it stands for
            out.append(f"\\x{o - 0xDC00:02x}")
        elif ch in "\\'":
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:  # its UTF-8 bytes, each escaped
            out.extend(f"\\x{b:02x}" for b in ch.encode("utf-8", "surrogatepass"))
    return "$'" + "".join(out) + "'"


def run_hints(command: str, cfg, start: str | None = None) -> dict[str, str]:
    """The task, data and starting model a run was given, for its next commands; placeholders only
    where the run does not know (an SFT run's task is whatever its conversations teach)."""
    task = {"train": "hellaswag", "sft": "arithmetic,compare"}.get(command, "arithmetic")
    data, start = "PREFS_EVAL.jsonl", start or "SFT_RUN"  # data: held-out pairs, which no run is told of
    if cfg is None:
        return {"task": task, "data": data, "start": start}
    source = getattr(getattr(cfg, command, None), "data", "") if command in ("sft", "dpo", "rm") else ""
    if command == "rl":
        task = cfg.rl.task
    elif command == "sft":
        task = _pairs_task(cfg.sft.data) or task
    elif command in ("dpo", "rm"):
        sec = getattr(cfg, command)
        task = (getattr(sec, "task", "") or _pairs_task(sec.data)) or ("arithmetic,compare" if command == "dpo"
                                                                       else "arithmetic")
        start = getattr(sec, "init_from", "") or start
    # the run's local data file: the files its next commands write go beside it (a hub dataset: beside the run)
    return {"task": task, "data": data, "start": start, "source": source if source and os.path.isfile(source) else ""}


def _pairs_task(data: str) -> str:
    """The generated task whose problems a local preference or conversation file holds ("" when not one
    of ours): its first row's prompt (or messages) is matched against the generators' wording."""
    import json
    import re

    try:
        with open(data, encoding="utf-8") as f:
            row = json.loads(f.readline(65536))
        prompt = row["prompt"] if "prompt" in row else row["messages"]
        text = prompt if isinstance(prompt, str) else " ".join(str(m.get("content", "")) for m in prompt)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return ""
    if re.search(r"Which is larger, \d+ or \d+\?", text):
        return "compare"
    if m := re.search(r"What is (\d+) [+-] (\d+)\?", text):
        return "arithmetic3" if len(m.group(1)) == len(m.group(2)) == 3 else "arithmetic"
    return ""


def next_commands(command: str, run: str, task: str, data: str = "PREFS_EVAL.jsonl", start: str = "SFT_RUN",
                  source: str = "") -> list[str]:
    """The commands a finished ``command`` run is ready for, with its own task, data and starting model.
    A reward model does not generate text, so it is offered scoring, RL and labelling instead of
    sample/chat (which would refuse it). What they write is placed by :mod:`gptforge.cli.hints`: new
    runs beside the run, new data files beside its data file ``source`` (else beside the run), the
    export under exports/ mirroring the run (:func:`beside`, :func:`export_dir`); never a fixed path."""
    export = f"gptforge export hf --ckpt {q(run)} --out {q(export_dir(run))}"
    name = Path(run).name or "run"  # a second reward model in the same folder gets its own RL run and file
    if command == "rm":
        one = task.split(",")[0]
        held = []
        if data == "PREFS_EVAL.jsonl" and one in ("compare", "arithmetic"):  # held-out pairs of the run's task
            # named after the pairs the run trained on, as the preference guide names them (prefs.jsonl ->
            # prefs_eval.jsonl); beside the run, after the task. A file already there is scored, not made again
            data = beside(source or run, f"{Path(source).stem}_eval.jsonl" if source else f"{one}_prefs_eval.jsonl")
            held = [] if os.path.isfile(data) else [
                f"gptforge prepare preferences {one} --n 500 --held-out --out {q(data)}"]
        return [*held, f"gptforge eval --ckpt {q(run)} --preferences {q(data)}",
                f"gptforge rl --init-from {q(start)} --task {one} --reward-model {q(run)} --out "
                f"{q(beside(run, f'rl_{name}'))}",
                f"gptforge prepare preferences {one} --policy {q(start)} --judge {q(run)} --out "
                f"{q(beside(source or run, f'prefs_judged_{name}.jsonl'))}",
                export]
    out = [f"gptforge chat --ckpt {q(run)}"] if command in ("sft", "rl", "dpo") else []
    out.append(f"gptforge sample --ckpt {q(run)}" + (' --prompt "ROMEO:"' if command == "train" else ""))
    out.append(f"gptforge eval --ckpt {q(run)} --tasks {task} --limit 200")
    if command == "sft" and (one := task.split(",")[0]) in (*GENERATED_TASKS, "gsm8k"):  # the chat journey: SFT -> RL
        out.append(f"gptforge rl --init-from {q(run)} --task {one} --out {q(beside(run, 'rl'))}")
    return [*out, export]
