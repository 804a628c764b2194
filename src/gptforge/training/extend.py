"""What a ``--resume`` will do, said before it does it: a finished run, or a run being extended.

    gptforge train --preset shakespeare-cpu --resume                         # "run ... is complete"
    gptforge train --preset shakespeare-cpu --resume --train.max_steps 400   # extend it

* **A finished run** (its newest checkpoint is at ``train.max_steps``) trains nothing: resuming it
  says so, how to extend it, and exits 0 (the default job re-runs ``--resume`` every time).
* **Extending** (``--resume --train.max_steps N`` with N above the checkpoint's): the LR schedule
  is a function of ``train.max_steps`` (:func:`gptforge.training.optim.lr_at`, llm.c's warmup +
  cosine), and the checkpoint stores no schedule of its own, so the cosine is **stretched** over the
  new length, as llm.c does when resumed with a larger ``-x``. The learning rate therefore jumps
  up at the resume step, from the end of the old decay to its point on the longer one (a warm
  restart). That is the documented choice: it keeps one schedule formula for fresh and resumed
  runs, and it still trains when ``optim.min_lr_frac`` is 0 (continuing at the old minimum would
  train at lr 0). The jump is printed with both values.
"""

from __future__ import annotations

import os
from pathlib import Path

from gptforge.config import Config
from gptforge.training.optim import lr_at


def resume_notice(saved: Config, cfg: Config, step: int, where: Path) -> tuple[bool, str | None]:
    """(complete, message) for resuming the checkpoint ``where`` at ``step``, saved with config
    ``saved``, under ``cfg`` (the saved config with this command line's overrides)."""
    run = where.parent.parent if where.parent.name == "checkpoints" else where
    new, old = cfg.train.max_steps, saved.train.max_steps
    if step >= new and cfg.model == saved.model:  # a changed model goes on to be checked against the weights
        suggest = max(2 * step, step + 1)
        return True, (
            f"run {run} is complete: its newest checkpoint ({where.name}) is at step {step} of "
            f"train.max_steps {new}; nothing to train. To train further: gptforge train --out {run} --resume "
            f"--train.max_steps {suggest} (the LR schedule is stretched to the new length). To use it: "
            f"gptforge sample --ckpt {run}")
    if new != old:
        before = lr_at(step, saved.optim, old) if step < old else saved.optim.lr * saved.optim.min_lr_frac
        after = lr_at(step, cfg.optim, new)
        verb, how = ("extending", "stretched") if new > old else ("shortening", "compressed")
        return False, (
            f"{verb} the run from train.max_steps {old} to {new}: the LR schedule (warmup + cosine) is "
            f"{how} over {new} steps, so the lr at step {step + 1} is {after:.3e} (the old schedule had "
            f"{before:.3e}); it decays to {cfg.optim.lr * cfg.optim.min_lr_frac:.3e} at step {new}")
    return False, None


def check_resume(saved: Config, cfg: Config, step: int, where: Path) -> bool:
    """Print the notice (rank 0 only under torchrun); True when the run is complete and nothing is to be done."""
    complete, message = resume_notice(saved, cfg, step, where)
    if message and int(os.environ.get("RANK", "0")) == 0:
        print(message, flush=True)
    return complete
