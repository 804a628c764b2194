"""The planner against Megatron-LM's published measurements (Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters using Megatron-LM", arXiv 2104.04473v5).

    python -m gptforge.plan.megatron          # the table in docs/benchmarks.md

Table 1 (weak scaling, GPT models with vocabulary 51,200 and sequence 2,048 on DGX A100 80GB) and
Table 2 (175B at a global batch of 1,536: PTD-P with model-parallel size 96 = TP 8 x PP 12 against
ZeRO-3 without model parallelism) report achieved TFLOP/s per GPU in their convention: the FLOPs of
their Eq. 3, which counts the recomputed forward (every run recomputes activations). The planner's
``Cost.tflops`` uses the same count, so the numbers compare directly.

What the paper does not say is filled in the same way for every row: micro-batch 1 for PTD-P
(Table 2 says so; assumed for Table 1), the non-interleaved 1F1B schedule, full recomputation
(``recompute block``), explicit (non-flash) attention, fp32 gradient all-reduce. ZeRO-3 rows use the
``deepspeed`` engine (fp16 traffic, parameters gathered again for the recomputed forward) with the
micro-batch Table 2 lists (4, 2, 1). Calibration: ``matmul_eff`` (plan/cluster.py) was fitted to the
18.4B row alone (TP 8, PP 1, no bubble); every other row is a prediction.
"""

from __future__ import annotations

from dataclasses import dataclass

from gptforge import environment
from gptforge.models.registry import size_config
from gptforge.plan.cluster import Cluster, get_cluster
from gptforge.plan.cost import Cost, Layout, estimate_cost


@dataclass(frozen=True)
class Row:
    table: str
    size: str  # model size name (models/gpt2.py SIZES)
    gpus: int
    batch: int  # global batch, sequences
    tp: int
    pp: int
    micro_batch: int
    shard: str  # none (PTD-P) | fsdp (ZeRO-3)
    published: float  # TFLOP/s per GPU
    goal: float  # allowed relative error (0 = not a goal row)


ROWS = [
    Row("1", "megatron-18b", 256, 1024, 8, 1, 1, "none", 135, 0.0),  # the calibration row
    Row("1", "megatron-145b", 1536, 2304, 8, 8, 1, "none", 148, 0.0),
    Row("1", "megatron-530b", 2520, 2520, 8, 35, 1, "none", 163, 0.0),
    Row("1", "megatron-1t", 3072, 3072, 8, 64, 1, "none", 163, 0.15),
    Row("2 PTD-P", "gpt3-175b", 384, 1536, 8, 12, 1, "none", 153, 0.15),
    Row("2 PTD-P", "gpt3-175b", 768, 1536, 8, 12, 1, "none", 149, 0.15),
    Row("2 PTD-P", "gpt3-175b", 1536, 1536, 8, 12, 1, "none", 141, 0.15),
    Row("2 ZeRO-3", "gpt3-175b", 384, 1536, 1, 1, 4, "fsdp", 144, 0.20),
    Row("2 ZeRO-3", "gpt3-175b", 768, 1536, 1, 1, 2, "fsdp", 88, 0.20),
    Row("2 ZeRO-3", "gpt3-175b", 1536, 1536, 1, 1, 1, "fsdp", 44, 0.20),
]
SEQ = 2048


def model(size: str):
    """Megatron's GPT at ``size``: vocabulary 51,200, sequence 2,048, biases, explicit attention."""
    return size_config(size, block_size=SEQ, vocab_size=51_200, pad_vocab=False, flash=False)


def layout(row: Row) -> Layout:
    return Layout(dp=row.gpus // (row.tp * row.pp), tp=row.tp, pp=row.pp, micro_batch=row.micro_batch,
                  recompute="block", shard=row.shard, engine="deepspeed" if row.shard == "fsdp" else "megatron")


def predict(row: Row, cluster: Cluster | None = None) -> Cost:
    return estimate_cost(model(row.size), layout(row), cluster or get_cluster("a100-80"), row.batch, SEQ)


def table(cluster: Cluster | None = None) -> list[dict]:
    out = []
    for r in ROWS:
        cost = predict(r, cluster)
        out.append({"table": r.table, "size": r.size, "gpus": r.gpus, "batch": r.batch, "tp": r.tp, "pp": r.pp,
                    "micro_batch": r.micro_batch, "published": r.published, "predicted": cost.tflops / 1e12,
                    "error": cost.tflops / 1e12 / r.published - 1, "goal": r.goal, "bubble": cost.bubble_frac,
                    "step_s": cost.step_s})
    return out


def main() -> None:
    print(f"{'table':<9} {'model':<14} {'GPUs':>5} {'batch':>5} {'TP':>3} {'PP':>3} {'b':>2} "
          f"{'paper':>6} {'plan':>6} {'error':>7} {'goal':>6} {'step s':>7}")
    for r in table():
        goal = f"±{r['goal']:.0%}" if r["goal"] else "-"
        print(f"{r['table']:<9} {r['size']:<14} {r['gpus']:>5} {r['batch']:>5} {r['tp']:>3} {r['pp']:>3} "
              f"{r['micro_batch']:>2} {r['published']:>6.0f} {r['predicted']:>6.1f} {r['error']:>+7.1%} {goal:>6} "
              f"{r['step_s']:>7.2f}")


if __name__ == "__main__":
    raise SystemExit(environment.tool(main, "python -m gptforge.plan.megatron"))
