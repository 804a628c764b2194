"""``gptforge plan``: will a model fit, on which parallel layout, and how fast will it train?

    gptforge plan --preset gpt2-1.5b --gpu-mem 80 --world 8     # data-parallel memory table
    gptforge plan --preset tiny --measure                       # estimate vs a measured peak, here
    gptforge plan --preset gpt3-175b --gpus 1024 --gpu h100-80  # layout, memory, step time, days

Everything is counted from the model family's formulas (``models/counting.py``); no model is built,
so any size answers in about a second.

* :mod:`~gptforge.plan.memory`: per-rank memory under DDP / ZeRO-1 / FSDP, and proposals that fit;
* :mod:`~gptforge.plan.measure`: the measured peak of a few real steps (``--measure``);
* :mod:`~gptforge.plan.cluster`: GPU presets (a100-40, a100-80, h100-80, h200) with their sources;
* :mod:`~gptforge.plan.cost`: the communication and time model (its docstring states it) and
  :func:`~gptforge.plan.cost.comm_volume`, the bytes per collective kind per rank of a layout;
* :mod:`~gptforge.plan.search`: the layout search;
* :mod:`~gptforge.plan.megatron`: the model against Megatron-LM's published Tables 1 and 2;
* :mod:`~gptforge.plan.report`: what the command prints.
"""

from gptforge.plan.cluster import CLUSTERS, Cluster, get_cluster
from gptforge.plan.cost import Cost, Layout, comm_volume, estimate_cost
from gptforge.plan.measure import LiveTensorBytes, measure_peak
from gptforge.plan.memory import GIB, Estimate, count_params, estimate, plan_overrides, propose
from gptforge.plan.report import run_parallel, run_plan
from gptforge.plan.search import search

__all__ = ["CLUSTERS", "GIB", "Cluster", "Cost", "Estimate", "Layout", "LiveTensorBytes", "comm_volume", "count_params",
           "estimate", "estimate_cost", "get_cluster", "measure_peak", "plan_overrides", "propose", "run_parallel",
           "run_plan", "search"]
