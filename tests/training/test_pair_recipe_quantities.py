"""DPO and the reward model through their recipe path (``gptforge dpo`` / ``gptforge rm`` on the one loop)
checked against a direct float64 computation of what each step uses and logs (issue 36): each
micro-step's batch and the weights it runs on are captured, and the loss is recomputed here from the
rows' tokens (a forward per row, no padding, the formulas written out): the sequence log-probs of the
chosen and rejected replies under the policy and the starting model, the sigmoid and IPO losses, the
RPO NLL term, the Bradley–Terry loss with margins and centring; the logged step metrics are the
micro-steps' means. TRL's equality of the loss functions themselves is test_trl_fidelity.py's.

The settings that change the path each take it: the cached reference table and the live reference
model (``dpo.precompute_ref``), ``dpo.loss_type ipo``, ``dpo.sft_coef``, ``rm.center_coef``,
gradient accumulation.

Planted bugs these catch: the reference table indexed by batch position instead of pair index; the
reference taken after the first update; beta dropped from the margin; the NLL term's sign; the
reward read at the padding instead of the last reply token; the margin not subtracted.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F

from gptforge.cli import main
from gptforge.training import dpo as dpo_mod
from gptforge.training import rm as rm_mod

CPU = ["--device", "cpu", "--ckpt-every", "0"]


@pytest.fixture(scope="module")
def world(tmp_path_factory, tokenizer):
    from gptforge.eval.tasks.preferences import preference_set, write_preferences
    from tests.conftest import tiny_chat_checkpoint

    tmp = tmp_path_factory.mktemp("pairq")
    rows = preference_set("compare", 24, seed=1)
    write_preferences([{**r, "margin": (i % 3) * 0.5} for i, r in enumerate(rows)], tmp / "margins.jsonl")
    return tmp, tiny_chat_checkpoint(tmp / "sft"), write_preferences(rows, tmp / "prefs.jsonl")


def _rows(out, kind):
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def _spy(monkeypatch, cls):
    calls = []
    real = cls.micro_step

    def micro_step(self, run, batch):
        if not calls:
            calls.append({"start": copy.deepcopy(run.model)})  # the starting weights: DPO's reference
        snap = copy.deepcopy(run.model)
        loss, m = real(self, run, batch)
        calls.append({"model": snap, "batch": batch, "loss": loss.item(), "metrics": m})
        return loss, m

    monkeypatch.setattr(cls, "micro_step", micro_step)
    return calls


def _spy_eval(monkeypatch, cls):
    """Each held-out eval: the weights it scores with and its batches (this rank's held-out pairs)."""
    evals = []
    real = cls.held_out_batches

    def held_out_batches(self, run):
        batches = real(self, run)
        evals.append({"model": copy.deepcopy(run.model), "batches": batches})
        return batches

    monkeypatch.setattr(cls, "held_out_batches", held_out_batches)
    return evals


@torch.no_grad()
def seq_logp(model, ids, mask) -> tuple[float, int]:
    """One row: the sum of log p(token | everything before it) over the reply tokens, float64."""
    m = copy.deepcopy(model).double().eval()
    pos = mask.nonzero().flatten().tolist()
    seq = ids[: pos[-1] + 1]
    logits, _ = m(seq[None, :-1])
    lp = torch.log_softmax(logits[0].double(), -1)
    return sum(lp[t - 1, seq[t]].item() for t in pos), len(pos)


def dpo_hand(model, ref, b, beta, sft_coef, ipo) -> dict[str, float]:
    """A pair batch's DPO / IPO loss (+ the RPO term) and margin, float64, from per-row log-probs."""
    n = b.n
    rows = [seq_logp(model, b.ids[k].cpu(), b.mask[k].cpu()) for k in range(2 * n)]
    refs = [seq_logp(ref, b.ids[k].cpu(), b.mask[k].cpu()) for k in range(2 * n)]
    pc, pr = torch.tensor([x for x, _ in rows[:n]]), torch.tensor([x for x, _ in rows[n:]])
    rc, rr = torch.tensor([x for x, _ in refs[:n]]), torch.tensor([x for x, _ in refs[n:]])
    lc, lr = torch.tensor([n_ for _, n_ in rows[:n]], dtype=torch.float64), \
        torch.tensor([n_ for _, n_ in rows[n:]], dtype=torch.float64)
    hc, hr = pc - rc, pr - rr
    if ipo:
        loss = ((hc / lc - hr / lr - 1 / (2 * beta)) ** 2).mean()
    else:
        loss = -F.logsigmoid(beta * (hc - hr)).mean()
    if sft_coef:
        loss = loss + sft_coef * (-pc.sum() / lc.sum())
    return {"loss": loss.item(), "rewards/margins": (beta * (hc - hr)).mean().item(), "logps/chosen": pc.mean().item(),
            "rewards/accuracies": (hc > hr).double().mean().item()}


@pytest.mark.parametrize("flags", [[], ["--dpo.precompute_ref", "false", "--sft-coef", "0.5", "--beta", "0.3"],
                                   ["--loss-type", "ipo", "--dpo.grad_accum", "2"]],
                         ids=["cached-ref", "live-ref-rpo", "ipo-accum"])
def test_dpo_step_against_a_hand_computation(world, tmp_path, monkeypatch, flags):
    tmp, sft, prefs = world
    calls = _spy(monkeypatch, dpo_mod.DPO)
    evals = _spy_eval(monkeypatch, dpo_mod.DPO)
    assert main(["dpo", "--init-from", str(sft), "--data", str(prefs), "--out", str(tmp_path / "d"), "--steps", "2",
                 "--val-count", "5", "--micro-batch", "4", "--lr", "5e-2", *CPU, *flags]) == 0
    beta = 0.3 if "--beta" in flags else 0.1
    sft_coef = 0.5 if "--sft-coef" in flags else 0.0
    ipo = "ipo" in flags
    ref = calls[0]["start"]
    steps = calls[1:]
    accum = 2 if "--dpo.grad_accum" in flags else 1
    assert len(steps) == 2 * accum
    for c in steps:
        want = dpo_hand(c["model"], ref, c["batch"], beta, sft_coef, ipo)
        assert c["loss"] == pytest.approx(want["loss"], abs=3e-5, rel=3e-5)
        m = c["metrics"]
        assert m["rewards/margins"] == pytest.approx(want["rewards/margins"], abs=3e-5, rel=3e-5)
        assert m["logps/chosen"] == pytest.approx(want["logps/chosen"], abs=3e-4, rel=3e-5)
    assert any(abs(c["metrics"]["rewards/margins"]) > 1e-3 for c in steps[accum:])  # the policy moved off the ref
    logged = _rows(tmp_path / "d", "dpo")
    assert len(logged) == 2
    for s, rec in enumerate(logged):
        mine = steps[s * accum : (s + 1) * accum]
        assert rec["loss"] == pytest.approx(sum(c["loss"] for c in mine) / accum, rel=1e-5)
    # the held-out evals (start and end): the held-out pairs against the same reference (the cached
    # table's held-out rows, or the live model), with the same loss; the end one off the reference
    held = _rows(tmp_path / "d", "eval")
    assert [r["step"] for r in held] == [0, 2] and len(evals) == 2
    for e, rec in zip(evals, held, strict=True):
        parts = [(b.n, dpo_hand(e["model"], ref, b, beta, sft_coef, ipo)) for b in e["batches"]]
        assert sum(k for k, _ in parts) == 5 == rec["n"] and len(parts) == 2  # batches of 4 and 1: weighted by pairs
        for key in ("loss", "rewards/margins", "rewards/accuracies"):
            assert rec[key] == pytest.approx(sum(k * w[key] for k, w in parts) / 5, abs=3e-5, rel=3e-5), key
    assert abs(held[-1]["rewards/margins"]) > 1e-3

@torch.no_grad()
def rm_rewards(model, b) -> tuple[torch.Tensor, torch.Tensor]:
    """A pair batch's (chosen, rejected) rewards, float64: each row's final hidden state at its reply's
    last token (the row cut there, so no padding is seen) times the score head, one row at a time."""
    m = copy.deepcopy(model).double().eval()
    r = []
    for k in range(2 * b.n):
        last = int(b.mask[k].nonzero().max())  # the reply's last token
        h = m.body.hidden_states(b.ids[k : k + 1, : last + 1].cpu())[0, -1]
        r.append((h @ m.score.weight[0]).item())
    return torch.tensor(r[: b.n], dtype=torch.float64), torch.tensor(r[b.n :], dtype=torch.float64)


def bt_loss(rc, rr, margin, center) -> float:
    d = rc - rr if margin is None else rc - rr - margin.cpu().double()
    return (-F.logsigmoid(d).mean() + center * ((rc + rr) ** 2).mean()).item()


@pytest.mark.parametrize("data,flags", [("prefs", []), ("margins", ["--rm.center_coef", "0.1", "--rm.grad_accum", "2"]),
                                        ("margins", ["--rm.use_margin", "false"])],
                         ids=["plain", "margins-centred-accum", "margins-ignored"])
def test_rm_step_against_a_hand_computation(world, tmp_path, monkeypatch, data, flags):
    tmp, sft, prefs = world
    if data == "margins":  # Llama 2's margins in the data: subtracted inside the sigmoid unless rm.use_margin false
        prefs = tmp / "margins.jsonl"
    calls = _spy(monkeypatch, rm_mod.RM)
    evals = _spy_eval(monkeypatch, rm_mod.RM)
    assert main(["rm", "--init-from", str(sft), "--data", str(prefs), "--out", str(tmp_path / "r"), "--steps", "2",
                 "--val-count", "5", "--micro-batch", "4", "--lr", "5e-2", *CPU, *flags]) == 0
    center = 0.1 if "--rm.center_coef" in flags else 0.0
    use_margin = data == "margins" and "--rm.use_margin" not in flags
    for c in calls[1:]:
        b = c["batch"]
        rc, rr = rm_rewards(c["model"], b)
        assert (b.margin is not None) == (data == "margins")
        assert c["loss"] == pytest.approx(bt_loss(rc, rr, b.margin if use_margin else None, center), abs=3e-5, rel=3e-5)
        assert c["metrics"]["margin"] == pytest.approx((rc - rr).mean().item(), abs=3e-5, rel=3e-5)
        assert c["metrics"]["accuracy"] == (rc > rr).double().mean().item()
    logged = _rows(tmp_path / "r", "rm")
    accum = 2 if "--rm.grad_accum" in flags else 1
    for s, rec in enumerate(logged):
        mine = calls[1 + s * accum : 1 + (s + 1) * accum]
        assert rec["loss"] == pytest.approx(sum(c["loss"] for c in mine) / accum, rel=1e-5)
    # the held-out evals (start and end) score the held-out pairs with the same loss: margins and centring
    held = _rows(tmp_path / "r", "eval")
    assert [r["step"] for r in held] == [0, 2] and len(evals) == 2
    for e, rec in zip(evals, held, strict=True):
        parts = [(b.n, rm_rewards(e["model"], b), b.margin) for b in e["batches"]]
        n = sum(k for k, _, _ in parts)
        assert n == 5 and rec["n"] == 5 and len(parts) == 2  # batches of 4 and 1: weighted by pairs
        if use_margin:
            assert any(float(m.abs().sum()) > 0 for _, _, m in parts)  # the margins are not all 0
        want = sum(k * bt_loss(rc, rr, m if use_margin else None, center) for k, (rc, rr), m in parts) / n
        assert rec["loss"] == pytest.approx(want, abs=3e-5, rel=3e-5)
        assert rec["margin"] == pytest.approx(sum(k * (rc - rr).mean().item() for k, (rc, rr), _ in parts) / n,
                                              abs=3e-5, rel=3e-5)
