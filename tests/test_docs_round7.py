"""What a newcomer reads, checked for a whole class at once: every option's ``--help`` states its default
(sub-commands such as ``prepare files`` included, and a default of 0), and every guide names where the
models and data it reads come from (written by its own commands, or named in its prose: "the default job's
``runs/shakespeare-cpu``"), a preset's shards included (``train --preset gpt2-350m`` reads
``data/fineweb100B``); every ``python -m gptforge.MODULE ...`` a page shows parses with that module's own parser;
and a guide whose commands need an optional extra (serve, gguf, plot, ...) names it."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from tests.test_docs import FENCE, JOURNEY_PAGES, _command_lines, _flag_values, _ignored_roots, _page_blocks, _rel

# --- --help: every default said -----------------------------------------------------------------------------

# a config key named as where the flag's value goes: "(rm.seed, ...)", "...; sft.seed)", "dpo.beta (...": at the
# help's start, after "(" or "; " (not "--rl.top_k", another spelling of the flag, nor "model.safetensors" in prose)
CONFIG_KEY = re.compile(r"(?:^|\(|; )(?:train|optim|model|data|eval|dist|lora|sft|rm|dpo|rl)\.[a-z_]+\b")


def _options() -> list[tuple[str, argparse.Action]]:
    """(command path, action) for every option of every command and sub-command of the real parser."""
    from gptforge.cli import build_parser

    out = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, [*path, name])
            elif path and a.option_strings and not isinstance(a, argparse._HelpAction):
                out.append((" ".join(path), a))

    walk(build_parser(), [])
    return out


def _shown(action: argparse.Action) -> str:
    """The option's help as ``--help`` prints it (``%(default)s`` filled in)."""
    return (action.help or "") % {**vars(action), "prog": "gptforge"}


def test_every_option_with_a_default_says_it():
    """An option with a value when not given (a default that is neither None nor a switch's False) says it in
    --help: ``eval --limit``'s 0 was hidden (``0 in (None, False)`` is true), and so was every default of
    ``prepare``'s sub-commands (``--text-field text``, ``--name data``)."""
    options = _options()
    assert any(cmd == "prepare files" for cmd, _ in options)  # the walk reaches sub-commands
    silent = [f"{cmd} {max(a.option_strings, key=len)} (default {a.default!r})" for cmd, a in options
              if a.default is not None and a.default is not False and a.default != argparse.SUPPRESS
              and "default" not in _shown(a).lower()]
    assert not silent, f"options whose --help does not say their default: {silent}"


def test_every_flag_that_sets_a_config_key_says_its_default():
    """A flag that stands for a config key (``rm --steps``: ``train.max_steps``) takes the recipe's default when
    not given (argparse's is None); its --help says which (``rm --lr`` and ``dpo --steps`` said nothing)."""
    options = _options()
    silent = [f"{cmd} {max(a.option_strings, key=len)}" for cmd, a in options
              if a.default is None and CONFIG_KEY.search(_shown(a)) and "default" not in _shown(a).lower()]
    assert not silent, f"flags naming their config key but not its default: {silent}"
    assert sum(1 for _, a in options if a.default is None and CONFIG_KEY.search(_shown(a))) > 20  # the rule applies


def test_help_defaults_are_the_recipes():
    """The defaults rm/dpo/sft --help state are the ones the recipe runs with (not a copy that can drift)."""
    from gptforge.cli.align import _pair_defaults
    from gptforge.cli.post import _sft_defaults

    helps = {(cmd, max(a.option_strings, key=len)): _shown(a) for cmd, a in _options()}
    for section in ("rm", "dpo"):
        run = _pair_defaults(section)
        assert f"default {run.train.max_steps})" in helps[(section, "--steps")]
        assert f"default {run.optim.lr:g})" in helps[(section, "--lr")]
        assert f"default {run.train.micro_batch})" in helps[(section, "--micro-batch")]
    assert f"default {_sft_defaults().train.max_steps};" in helps[("sft", "--steps")]


# --- guides: what they read comes from somewhere the reader is told ------------------------------------------

# flags whose value is a model, a run, data or a file a command reads (a comma list: an ensemble)
READS = ("--ckpt", "--init-from", "--data", "--data.dir", "--policy", "--against", "--reward-model", "--paired-with",
         "--model", "--tokenizer", "--judge", "--gguf", "--llmc", "--hf", "--preferences", "--resume")
WRITES = ("--out", "--json", "--image", "--train.out_dir")


def _implicit_out(argv: list[str]) -> str | None:
    """Where a command writes when it is given no --out: ``train --preset P`` into P's ``train.out_dir``,
    ``prepare shakespeare`` and ``prepare fineweb`` into their default folders (as the code resolves them)."""
    if _flag_values(argv, ("--out", "--train.out_dir")):
        return None
    if argv[0] == "train":
        from gptforge.presets import get_preset

        preset = (_flag_values(argv, ("--preset",)) or ["shakespeare-cpu"])[0]
        return get_preset(preset).train.out_dir
    if argv[:2] == ["prepare", "shakespeare"]:
        import inspect

        from gptforge.data.prepare.shakespeare import prepare

        return str(inspect.signature(prepare).parameters["out"].default)
    if argv[:2] == ["prepare", "fineweb"]:
        sample = (_flag_values(argv, ("--sample",)) or ["10BT"])[0]
        return f"data/{'edu_' if '--edu' in argv else ''}fineweb{sample.removesuffix('T')}"
    return None


def _preset_data(argv: list[str]) -> list[str]:
    """The shard folders the presets a ``train``/``race`` line names read (``bench`` makes its own shard)."""
    from gptforge.presets import get_preset

    if argv[0] == "bench":
        return []
    if argv[0] == "race":
        names = [a.split(",")[0] for a in argv[1:] if not a.startswith("-")][:1]  # race trains on the first's data
    else:
        names = (_flag_values(argv, ("--preset",)) or ["shakespeare-cpu"])[:1]
    return [get_preset(n).data.dir for n in names]


def _reads_and_writes(page: Path) -> tuple[set[str], set[str]]:
    """(local paths the page's commands read, paths they write), local meaning inside a git-ignored folder
    (``runs/``, ``data/``, ``exports/``): a hub name or a placeholder (``FILE``) is not a path a guide owes."""
    roots = _ignored_roots()
    reads, writes = set(), set()
    for block in _page_blocks(page):
        writes |= set(re.findall(r"(?:^|\s)>\s*([\w./-]+)", re.sub(r"#.*", "", block), flags=re.M))
        for cmd in _command_lines(block):
            argv = shlex.split(cmd)
            writes |= set(_flag_values(argv, WRITES))
            if out := _implicit_out(argv):
                writes.add(out)
            values = [p for v in _flag_values(argv, READS) for p in v.split(",")]
            if argv[0] in ("train", "race", "bench") and not _flag_values(argv, ("--data.dir",)):
                values += _preset_data(argv)  # a preset reads its own shards
            if argv[0] == "plot":  # its runs are positional
                values += [a for a in argv[1:] if not a.startswith("-")]
            reads |= {str(Path(v)) for v in values if v and Path(v).parts[0] in roots}
    return reads, {str(Path(w)) for w in writes if w}


def _unexplained(page: Path) -> list[str]:
    reads, writes = _reads_and_writes(page)
    said = FENCE.sub("", page.read_text())  # prose, inline code included: "the default job's `runs/...`"
    return sorted(r for r in reads
                  if not any(r == w or r.startswith(w + "/") for w in writes) and r not in said)


@pytest.mark.parametrize("page", JOURNEY_PAGES, ids=_rel)
def test_every_path_a_guide_reads_is_written_there_or_named_as_a_prerequisite(page):
    """A guide that reads ``runs/tokenizer/llama`` or ``data/shakespeare`` either makes it with its own
    commands or says, outside its code blocks, where it comes from (which guide or job writes it); a newcomer
    who starts at that guide otherwise meets 'no checkpoint' with nothing to tell them what to run first."""
    missing = _unexplained(page)
    assert not missing, (f"{_rel(page)} reads {missing} without writing them or naming them in its prose: say "
                         "which guide or job makes each (e.g. 'the default job's `runs/shakespeare-cpu`')")


def test_the_prerequisite_walk_sees_reads_and_implicit_writes():
    """The walk finds what the guides read and what a command writes with no --out (an empty walk would
    pass anything)."""
    from tests.test_docs import DOCS

    reads, writes = _reads_and_writes(DOCS / "chat.md")
    assert {"runs/shakespeare-cpu", "runs/chat/sft", "runs/chat/conv.jsonl"} <= reads
    reads, writes = _reads_and_writes(DOCS / "pretraining.md")
    assert {"runs/shakespeare-cpu", "data/shakespeare", "runs/llama-tiny", "data/fineweb10B"} <= writes
    reads, _ = _reads_and_writes(DOCS / "evaluation.md")
    assert "runs/tokenizer/llama" in reads  # plot's positional runs
    reads, _ = _reads_and_writes(DOCS / "scale-out.md")
    assert {"data/edu_fineweb100B", "data/fineweb100B", "data/shakespeare"} <= reads  # the presets' own shards
    reads, _ = _reads_and_writes(DOCS / "preferences.md")
    assert {"runs/prefs/rm1", "runs/prefs/rm3"} <= reads  # an ensemble's members


# --- `python -m gptforge.MODULE ...` and `bash scripts/NAME.sh ...`: the other commands the pages show ---------

# a script that passes its arguments through to a module (``exec ... python -m gptforge.bench.readme_numbers "$@"``)
SCRIPT_MODULES = {"scripts/readme_numbers.sh": "gptforge.bench.readme_numbers"}
MODULE_CMD = re.compile(r"python -m (gptforge(?:\.\w+)+)((?: +[^ `|;&)]+)*)")
SCRIPT_CMD = re.compile(r"(?:bash )?(scripts/[\w-]+\.sh)((?: +[^ `|;&)#]+)*)")


def _page_text_commands(page: Path, pattern: re.Pattern) -> list[tuple[str, list[str]]]:
    """(target, argv) of every match in the page, code blocks and inline code alike."""
    text = re.sub(r"\\\n\s*", " ", page.read_text())
    return [(m.group(1), shlex.split(m.group(2))) for m in pattern.finditer(text)]


def _module_commands() -> list[tuple[str, str, list[str]]]:
    from tests.test_docs import PAGES

    out = []
    for page in PAGES:
        out += [(_rel(page), mod, argv) for mod, argv in _page_text_commands(page, MODULE_CMD)]
        out += [(_rel(page), SCRIPT_MODULES[s], argv) for s, argv in _page_text_commands(page, SCRIPT_CMD)
                if s in SCRIPT_MODULES]
    return out


class _Parsed(Exception):
    pass


@pytest.mark.parametrize("where,module,argv", _module_commands(), ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_every_module_command_a_page_shows_parses(where, module, argv, monkeypatch):
    """``python -m gptforge.bench.trace step.json.gz --steps 3``: the module exists, runs as a program, and its own
    parser takes the flags the page gives (stopped right after parsing: nothing runs)."""
    import importlib
    import inspect

    try:
        mod = importlib.import_module(module)
    except ImportError:
        pytest.fail(f"{where}: `python -m {module}`: no such module")
    assert hasattr(mod, "main"), f"{where}: `python -m {module}` has no main()"
    import gptforge.argparsing  # noqa: F401  (its parser classes are among the subclasses walked below)

    def stopping(real):
        def parse_then_stop(self, args=None, namespace=None):
            from tests.test_docs import _exact_flags

            _exact_flags(self)  # a truncated flag (--seed for --seeds) is argparse's abbreviation: take flags as spelled
            real(self, args, namespace)
            raise _Parsed
        return parse_then_stop

    # Every parser class that defines its own parse_args is stopped, not only argparse's: gptforge's OneLineParser
    # overrides it (strays named with their close match), and a patch of the base alone let main() run the whole
    # command (readme_numbers' chat journey, for hours) inside the suite.
    classes, todo = [], [argparse.ArgumentParser]
    while todo:
        cls = todo.pop()
        classes.append(cls)
        todo.extend(cls.__subclasses__())
    for cls in classes:
        if "parse_args" in vars(cls):
            monkeypatch.setattr(cls, "parse_args", stopping(vars(cls)["parse_args"]))
    source = inspect.getsource(mod.main)  # a parser: argparse's, or argparsing.tool_parser (the commands' class)
    if "ArgumentParser" not in source and "tool_parser" not in source:  # none to stop (config_doc's main rewrites a page)
        takes = re.findall(r'"(--[\w-]+)"', inspect.getsource(mod.main))
        assert all(a in takes for a in argv), f"{where}: `python -m {module}` takes {takes}, the page gives {argv}"
        return
    try:
        mod.main(argv)
    except _Parsed:
        return
    except SystemExit as e:
        pytest.fail(f"{where}: `python -m {module} {' '.join(argv)}` does not parse (exit {e.code})")
    pytest.fail(f"{where}: `python -m {module}`: main() returned without parsing its arguments")


def test_the_module_walk_finds_the_commands():
    found = {(m, tuple(a)) for _, m, a in _module_commands()}
    assert ("gptforge.bench.trace", ("step.json.gz", "--steps", "3")) in found
    assert any(m == "gptforge.bench.readme_numbers" and "--seeds" in a for m, a in found)  # via the script too
    assert len(found) >= 8


# --- optional extras: a guide whose commands need one names it ------------------------------------------------

# what asks for an extra (gptforge.extras.require's callers): a predicate on a command's argv
NEEDS_EXTRA = {
    "serve": lambda a: a[0] == "serve",
    "gguf": lambda a: a[:2] in (["export", "gguf"], ["import", "gguf"]) or "--gguf" in a
    or (a[0] in ("sft", "dpo", "rm", "rl", "train") and any(v.endswith(".gguf") for v in _flag_values(a, ("--init-from",)))),
    "plot": lambda a: a[0] == "plot" or (a[0] == "race" and "--no-plot" not in a),
    "data": lambda a: a[:2] == ["prepare", "fineweb"] or a[0] == "bench-prepare",
    "eval": lambda a: a[:2] == ["assets", "evals"] and "--online" not in a,
    "hf": lambda a: a[0] == "bench-generate",
}


def _names_extra(text: str, extra: str) -> bool:
    """``extra `serve```, ``the `serve` extra``, ``extra serve``, ``'.[serve]'``, ``extras `a` and `serve```."""
    return bool(re.search(rf"extras?\b[^.\n]{{0,40}}`?\b{extra}\b`?|`{extra}` extra|\[{extra}\]", text))


def _extras_unnamed(page: Path) -> list[str]:
    text = page.read_text()
    missing = set()
    for block in _page_blocks(page):
        for cmd in _command_lines(block):
            argv = shlex.split(cmd)
            missing |= {e for e, needs in NEEDS_EXTRA.items() if needs(argv) and not _names_extra(text, e)}
    return sorted(missing)


@pytest.mark.parametrize("page", JOURNEY_PAGES, ids=_rel)
def test_a_guide_names_the_extras_its_commands_need(page):
    """The default job installs the core dependencies only: a guide that runs ``serve``, reads a GGUF or races
    with a plot says which extra to install, or a newcomer meets the refusal first."""
    missing = _extras_unnamed(page)
    assert not missing, f"{_rel(page)}: commands need the extra(s) {missing}, which the page never names"


def test_the_extras_table_is_the_codes():
    """Every extra the table names exists (gptforge.extras.EXTRAS), and the walk finds needs (an empty walk
    would pass anything)."""
    from gptforge.extras import EXTRAS
    from tests.test_docs import DOCS

    assert set(NEEDS_EXTRA) <= set(EXTRAS)
    assert _names_extra("needs the extra `gguf` (x)", "gguf") and not _names_extra("a gguf file", "gguf")
    needs = {e for p in (DOCS / "own-model.md", DOCS / "chat.md") for b in _page_blocks(p) for c in _command_lines(b)
             for e, f in NEEDS_EXTRA.items() if f(shlex.split(c))}
    assert {"gguf", "serve"} <= needs
