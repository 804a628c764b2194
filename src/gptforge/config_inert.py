"""Overrides a run would silently ignore, refused by name (``refuse_inert_overrides``): a key of another
command's section (``train --rl.kl_coef 0.1``), or one that acts only under a setting the config lacks
(``--lora.alpha`` at ``lora.rank`` 0, ``rl --gamma`` under GRPO).

    RECIPE_SECTIONS  which recipe sections each kind of run reads
    SECTION_OWNER    who reads each recipe section (named in the refusal)
    ACTS_ONLY_WITH   keys that act only with another setting, and what they need

Every command that starts or resumes a run calls it (``cli.common.resolve_run``; ``plan`` and ``bench``
directly), so a new command inherits it; a new section or dependent key adds a row here, and
tests/cli/test_inert_overrides.py walks the tables. Its own module, beside :mod:`gptforge.config` (which it
reads), to keep that file to the sections and their parsing.
"""

from __future__ import annotations

from gptforge.config import Config, ConfigError, override_pairs

RECIPE_SECTIONS = {"pretrain": ("lora",), "sft": ("sft", "lora"), "grpo": ("rl", "lora"), "ppo": ("rl", "lora"),
                   "rm": ("rm", "lora"), "dpo": ("dpo", "lora"),
                   "plan": ("lora",), "bench": ()}  # the recipe sections each kind of run reads (plan: LoRA's memory)
SECTION_OWNER = {"sft": "`gptforge sft`", "rl": "`gptforge rl`", "rm": "`gptforge rm`", "dpo": "`gptforge dpo`",
                 "lora": "LoRA runs (train --init-from, sft, rl, rm, dpo)"}
ACTS_ONLY_WITH = (  # (keys, whether this config lets them act, what they need)
    (("lora.alpha", "lora.dropout", "lora.targets", "lora.base"), lambda c: c.lora.rank > 0,
     "--lora.rank R > 0 (rank 0 is full fine-tuning: no adapters)"),
    (("rl.gamma", "rl.lam", "rl.vf_coef", "rl.clip_value", "rl.value_init"), lambda c: c.rl.algo == "ppo",
     "--algo ppo (GRPO has no value model)"),
    (("rl.kl_horizon",), lambda c: c.rl.kl_target > 0, "--kl-target T > 0 (the adaptive KL controller)"),
    (("rl.reward_reduce", "rl.reward_norm"), lambda c: bool(c.rl.reward_model), "--reward-model RUN (a learned reward)"),
)


def refuse_inert_overrides(cfg: Config, overrides: list[str], recipe: str, command: str) -> None:
    """Refuse a ``--section.key`` given on a command line that the run would silently ignore: a key of
    another command's section (``train --rl.kl_coef 0.1``, ``sft --dpo.beta 0.5``), or a key that acts only
    under a setting this config does not have (``--lora.alpha`` at ``lora.rank`` 0, ``rl --gamma`` under
    GRPO). A key given its default value changes nothing and passes (a whole config written out as
    overrides reproduces a run). ``train --init-from M --lora.rank R`` is LoRA continued pretraining, so pretrain reads lora.*.
    ``recipe``: the run's kind (:data:`RECIPE_SECTIONS`), ``command`` the one it runs under. One check for every command that starts or
    resumes a run (``cli.common.resolve_run``), so a new command or option inherits it."""
    reads = RECIPE_SECTIONS[recipe]
    for key, _ in override_pairs(overrides):
        section, name = key.split(".", 1)
        if section not in SECTION_OWNER:
            continue
        sec = getattr(cfg, section)
        if getattr(sec, name) == getattr(type(sec)(), name):
            continue  # the default, as every key of a whole config written out (a reproduced run) gives: nothing lost
        if section not in reads:
            raise ConfigError(f"--{key}: `gptforge {command}` never reads {section}.* (the settings of "
                              f"{SECTION_OWNER[section]}); drop it")
        for keys, acts, needs in ACTS_ONLY_WITH:
            if key in keys and not acts(cfg):
                raise ConfigError(f"--{key} would have no effect: it acts only with {needs}; add that, or drop it")
