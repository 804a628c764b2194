"""The guides' chat and preference journeys (docs/chat.md, docs/preferences.md: their "The path" blocks),
run as written but shrunk (slow lane): every command of the two code blocks, in order, in a scratch
directory, from a tiny base model standing in for the default job's ``runs/shakespeare-cpu``. Sizes
(steps, problems, pairs, replies) are cut to seconds; flags, paths and the order of the commands are the
guides' own, so a journey step that stops working (a renamed flag, a path one step writes and the next
cannot read, one guide reading what another was meant to write) fails here.

Interactive commands (``chat``, ``serve``) and the ensemble line (it names three reward models the
block does not make) are left out; on-policy pairs from a 2-step policy may be refused with "no pairs"
(every reply equally wrong), which is the command's own answer for such a model.

"Bring your own model" (docs/own-model.md) runs as a shell would (``VAR=$(gptforge ... | sed ...)``,
``echo MSG | gptforge chat``): the SmolLM2 block on the real GGUF and the GPT-2 block on a tiny local Hugging Face
GPT-2 standing in for the hub's, both in the heavy lane (``-m lane``).
"""

from __future__ import annotations

import re
import shlex

import pytest

from gptforge.cli import main
from tests.conftest import tiny_chat_checkpoint
from tests.test_docs import DOCS, _command_lines, _ignored_roots

pytestmark = pytest.mark.slow

SHRINK = [(r"--n \d+", "--n 24"), (r"--train\.max_steps \d+", "--train.max_steps 2"), (r"--steps \d+", "--steps 1"),
          (r"--limit \d+", "--limit 3"), (r"--prompts \d+", "--prompts 2"), (r"--group \d+", "--group 2"),
          (r"--max-new-tokens \d+", "--max-new-tokens 4"), (r"--train\.ckpt_every \d+", "--train.ckpt_every 1"),
          (r"--warmup-steps \d+", "--warmup-steps 0"), (r"step_000\d+", "step_000002")]
EXTRA = {"sft": "--val-count 8", "rm": "--val-count 8 --micro-batch 4", "dpo": "--val-count 8 --micro-batch 4 --eval-n 4",
         "rl": "--steps 1 --prompts 2 --group 2 --max-new-tokens 4 --eval-n 4",
         "prepare": "--samples 2 --max-new-tokens 4"}


def _block(guide: str, heading: str = "## The path") -> list[str]:
    """The commands of the first ```bash block under ``heading`` in docs/``guide``."""
    text = (DOCS / guide).read_text()
    after = text[text.index(heading):]
    return _command_lines(re.search(r"```bash\n(.*?)```", after, flags=re.S).group(1))


def _shrunk(cmd: str) -> list[str]:
    for pattern, small in SHRINK:
        cmd = re.sub(pattern, small, cmd)
    verb = cmd.split()[0]
    extra = EXTRA.get(verb, "")
    if verb == "prepare" and "--policy" not in cmd:
        extra = ""
    return shlex.split(cmd) + shlex.split(extra)


def _run(commands: list[str], capsys) -> None:
    for cmd in commands:
        if cmd.split()[0] in ("chat", "serve") or "/rm1," in cmd:
            continue
        argv = _shrunk(cmd)
        rc = main(argv)
        out, err = capsys.readouterr()
        if rc == 2 and "--policy" in cmd and "no pairs" in err:
            continue  # a 2-step policy is right or wrong alike on every problem: the refusal says so
        assert rc == 0, f"guide command failed ({rc}): gptforge {cmd}\nshrunk: {argv}\n{err[-2000:]}"
        assert "Traceback" not in out + err, cmd


def test_chat_and_preference_journeys_run_shrunk(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    tiny_chat_checkpoint(tmp_path / "runs" / "shakespeare-cpu", chat=False)  # the default job's model, tiny
    chat = _block("chat.md")
    prefs = _block("preferences.md")
    assert any(c.startswith("sft ") for c in chat) and any(c.startswith("rm ") for c in prefs)
    _run(chat, capsys)
    assert (tmp_path / "runs" / "chat" / "rl" / "metrics.jsonl").exists()
    _run(prefs, capsys)
    assert (tmp_path / "runs" / "prefs" / "grpo_rm" / "metrics.jsonl").exists()
    written = {p.name for p in tmp_path.iterdir()}  # nothing in the root but git-ignored folders
    assert "runs" in written and written <= _ignored_roots(), written


# --- "Bring your own model": the real SmolLM2 from its GGUF, and GPT-2 from Hugging Face ------------------

OWN_MODEL = DOCS / "own-model.md"


def _section_blocks(heading: str) -> list[str]:
    """The ```bash blocks of docs/own-model.md's section under ``heading`` (to the next ``## ``), as written."""
    text = OWN_MODEL.read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return re.findall(r"```bash\n(.*?)```", text[start:end if end > 0 else None], flags=re.S)


ASSIGN = re.compile(r"^(\w+)=\$\(gptforge (.+?) \| sed 's/\.\*: //'\)$")  # VAR=$(gptforge assets ... | sed ...)
PIPED = re.compile(r"""^echo ("[^"]*"|'[^']*') \| (gptforge .+)$""")  # a message piped into chat


def _run_block(block: str, capsys, monkeypatch, swap: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str]]:
    """Every line of a guide's block, in order, as a shell would run it: ``VAR=$(gptforge ... | sed
    's/.*: //')`` sets VAR from the command's output as that sed would, ``echo MSG | gptforge chat ...``
    feeds MSG on stdin, ``$VAR`` expands; gptforge lines run shrunk (``_shrunk``) with ``swap``'s
    (old, new) replacements (a hub name -> a local stand-in). Lines of other programs (llama.cpp,
    Ollama: not installed here) are left out. Returns (command, stdout) of each gptforge command."""
    import io

    env: dict[str, str] = {}
    ran = []
    for line in re.sub(r"\\\n\s*", " ", block).splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        stdin = None
        if m := ASSIGN.match(line):
            var, line = m.group(1), "gptforge " + m.group(2)
        else:
            var = None
            if m := PIPED.match(line):
                stdin, line = shlex.split(m.group(1))[0] + "\n", m.group(2)
        if not line.startswith("gptforge "):
            continue
        cmd = re.sub(r"\$(\w+)", lambda v: shlex.quote(env[v.group(1)]), line[len("gptforge "):])
        for old, new in swap:
            cmd = cmd.replace(old, new)
        argv = _shrunk(cmd) if var is None else shlex.split(cmd)
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin or ""))
        rc = main(argv)
        out, err = capsys.readouterr()
        assert rc == 0, f"guide command failed ({rc}): {line}\nran: {argv}\n{err[-2000:]}"
        assert "Traceback" not in out + err, line
        if var is not None:
            env[var] = re.sub(r".*: ", "", out.strip())  # sed 's/.*: //'
        ran.append((cmd, out + err))
    return ran


@pytest.mark.smollm
@pytest.mark.lane
def test_smollm2_journey_runs_shrunk(tmp_path, monkeypatch, capsys):
    """The section's SmolLM2 block on the real model, shrunk to 1-2 steps and 3 problems: chat from the
    GGUF, eval, LoRA SFT, preference pairs, DPO with LoRA, chat with the result, export gguf and chat
    with the exported file."""
    monkeypatch.chdir(tmp_path)
    smol = _section_blocks("## SmolLM2-135M-Instruct, from its GGUF")[0]
    assert "--gguf $SMOL" in smol and "--lora.rank" in smol and "export gguf" in smol
    ran = _run_block(smol, capsys, monkeypatch)
    verbs = [c.split()[0] for c, _ in ran]
    assert {"assets", "chat", "eval", "sft", "dpo", "export"} <= set(verbs)
    first_chat = next(out for c, out in ran if c.startswith("chat "))
    assert "The capital of France is Paris." in first_chat  # the untuned model, greedy: its known answer
    for c, out in ran:
        if c.split()[0] in ("sft", "dpo"):
            assert "LoRA rank 8" in out, c  # the adapters train, not the whole model
    ggufs = list((tmp_path / "exports").rglob("*.gguf"))
    assert ggufs and any(str(ggufs[0].relative_to(tmp_path)) in c for c, _ in ran if c.startswith("chat "))


def _tiny_hf_gpt2(out) -> None:
    """A tiny random GPT-2 as Hugging Face saves one, with GPT-2's tokenizer as transformers writes it
    (vocab.json, merges.txt, tokenizer.json): the hub's ``gpt2`` (124M) in miniature, offline."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    from gptforge.interop.hf_tokenizer import write_hf_tokenizer

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=128, vocab_size=50257)).save_pretrained(out)
    write_hf_tokenizer(out)
    GPT2TokenizerFast.from_pretrained(out).save_pretrained(out)


@pytest.mark.lane
def test_gpt2_from_hugging_face_journey_runs_shrunk(tmp_path, monkeypatch, capsys):
    """The section's GPT-2 block (the brief's path: GPT-2 from Hugging Face -> SFT -> chat), with a tiny
    local save_pretrained directory standing in for the hub's ``gpt2`` (nothing reaches the hub here).
    In the lane: ~10 s of CPU (transformers writing GPT-2's tokenizer.json is 4 of them), more than the
    default run can spare; tests/interop/test_hf_gpt2_tokenizer_json.py covers the tokenizer there."""
    pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    _tiny_hf_gpt2(tmp_path / "gpt2-tiny")
    capsys.readouterr()  # save_pretrained's progress bar
    block = _section_blocks("## GPT-2 124M from Hugging Face")[0]
    assert "--model gpt2 " in block
    ran = _run_block(block, capsys, monkeypatch, swap=(("--model gpt2 ", "--model gpt2-tiny "),))
    assert [c.split()[0] for c, _ in ran if c.split()[0] in ("import", "sft", "chat")] == ["import", "sft", "chat"]
    assert (tmp_path / "runs" / "gpt2" / "sft" / "metrics.jsonl").exists()
    chat_out = next(out for c, out in ran if c.startswith("chat "))
    assert "assistant>" in chat_out
