"""Every config key (``--section.key``) has a test of its effect, or is listed as not yet having one (issue 36).

``test_every_cli_option_has_an_effect.py`` walks the command line's options; the ``--section.key``
overrides are one code path (``apply_overrides``), but whether each key then reaches the code it names is
a question per key: ``optim.beta1`` was parsed, validated and saved, and a hard-coded ``betas=(0.9, 0.95)``
in the optimizer builder passed the optimizer, training and recipe tests (planted and run; found by
this walk, closed by tests/optim/test_optim_keys_effect.py). So this walks every key of ``Config`` (both model families) and
each must be
- in ``KEY_EFFECTS``: pytest node ids of tests that set the key off its default and check what it does
  against an independent reference (transformers, a float64 hand computation, torch's own optimizer, one
  process for a parallel layout); or
- reached by a recipe's short flag (``rl --gamma`` is ``rl.gamma``; the CLI walk's ``SHORT`` table, checked
  there by ``test_recipe_flags_reach_their_config_keys``) whose effect tests the CLI walk names; or
- in ``NOT_YET``, a list that may only shrink (``NOT_YET_MAX``): a new key comes in with its effect test.

Every node id is looked up in its file with ``ast`` (no import), and the named test, or its file (where the
settings sit in module constants and fixtures), must name the key (``section.key``, ``--section.key``,
``key=`` or ``"key"``), so an entry cannot point at an unrelated test.
"""

from __future__ import annotations

import ast
from pathlib import Path

from gptforge.config import Config, config_keys
from gptforge.models.llama import LlamaConfig
from tests.cli.test_every_cli_option_has_an_effect import CHAIN, EFFECTS, SHORT

ROOT = Path(__file__).resolve().parents[2]

LLAMA = "tests/models/test_llama.py::"
VARIANTS = "tests/models/test_llama_variants.py::test_hf_load_equals_transformers_past_the_original_context"
GPT2 = "tests/models/test_gpt2.py::"
OPTIM = "tests/optim/test_optim_keys_effect.py::"
RQ = "tests/training/test_recipe_quantities.py::"
PAIRQ = "tests/training/test_pair_recipe_quantities.py::"
MP = "tests/training/test_model_parallel.py::test_layout_matches_one_process"
ALIGNED = "tests/data/test_aligned.py::test_training_with_aligned_batches_and_document_attention_resumes_bit_exactly"
MASKS = "tests/models/test_masks.py::"
TRAINQ = "tests/training/test_train_keys_effect.py::"
PEFT = "tests/training/test_lora_peft.py::test_adapter_export_loads_in_peft_to_the_same_logits"
FAMILIES = "tests/models/test_llama_families.py::"

KEY_EFFECTS: dict[str, tuple[str, ...]] = {
    # the optimizer: built from the config, stepped, against AdamW by hand in float64 and torch.optim.Muon
    **{f"optim.{k}": (OPTIM + "test_adamw_keys_reach_the_step",)
       for k in ("beta1", "beta2", "eps", "weight_decay", "name")},
    **{f"optim.{k}": (OPTIM + "test_muon_keys_reach_the_step",)
       for k in ("muon_lr", "muon_momentum", "muon_nesterov", "muon_ns_steps", "muon_weight_decay")},
    "optim.fused": (OPTIM + "test_adamw_keys_reach_the_step",),
    "optim.muon_params": (OPTIM + "test_muon_params_picks_the_matrices_muon_takes",),
    "train.threads": (TRAINQ + "test_threads_is_the_intra_op_thread_count_the_run_computes_with",),
    "optim.schedule": ("tests/optim/test_muon.py::test_wsd_schedule_warmup_stable_cooldown",),
    "optim.cooldown_frac": ("tests/optim/test_muon.py::test_wsd_schedule_warmup_stable_cooldown",),
    "optim.min_lr_frac": ("tests/optim/test_muon.py::test_wsd_schedule_warmup_stable_cooldown",),
    "optim.embed_lr": ("tests/training/test_training.py::test_embed_lr_moves_only_untied_input_embeddings",),
    "optim.grad_clip": ("tests/training/test_lora_ppo.py::test_lora_ppo_step_against_a_hand_computation",),
    # the model: logits against transformers (configs off every default), or a formula
    # the shapes: a GPT-2 (2 layers, 2 heads, 32 wide, 64 positions) and a Llama (vocabulary 101) equal transformers'
    **{f"model.{k}": (GPT2 + "test_logits_match_transformers", LLAMA + "test_hf_save_pretrained_then_gptforge_load")
       for k in ("n_layer", "n_head", "n_embd", "block_size")},
    "model.bias": ("tests/models/test_model_keys_effect.py::test_bias_false_drops_every_bias_of_linear_layers_and_layer_norms",),
    "model.dropout": ("tests/models/test_model_keys_effect.py::"
                      "test_dropout_draws_masks_in_training_and_is_the_identity_in_evaluation",),
    "model.mlp": ("tests/models/test_model_keys_effect.py::test_llama_mlp_is_the_named_activation",),
    "model.vocab_size": (LLAMA + "test_hf_save_pretrained_then_gptforge_load",),
    "model.n_kv_head": (LLAMA + "test_n_kv_head_zero_means_multi_head", LLAMA + "test_hf_save_pretrained_then_gptforge_load"),
    "model.intermediate_size": (LLAMA + "test_hf_save_pretrained_then_gptforge_load",),
    "model.rope_theta": (LLAMA + "test_hf_save_pretrained_then_gptforge_load",),
    "model.norm_eps": (LLAMA + "test_hf_save_pretrained_then_gptforge_load",),
    "model.tie_embeddings": (LLAMA + "test_hf_save_pretrained_then_gptforge_load",),
    "model.qk_norm": (LLAMA + "test_qk_norm_matches_qwen3",),
    "model.logit_softcap": (LLAMA + "test_logit_softcap_bounds_and_matches_formula",),
    # the other families' fields (Qwen3, Mistral, Phi-3, Gemma 2/3, Granite, OLMo 2): logits equal transformers' past
    # the window, and each field put back to its default moves them (FEATURE_OFF there; OLMo 2's full-width q/k norm
    # has no per-head weights to put back: its load against transformers decides it)
    **{f"model.{k}": (FAMILIES + "test_hf_load_equals_transformers_longer_than_the_window",)
       for k in ("sliding_window", "layer_types", "attn_softcap", "query_pre_attn_scalar", "embed_scale",
                 "post_norms", "norm_plus_one", "rope_local_theta", "attn_scale", "residual_scale", "logits_scaling",
                 "pre_norms", "qk_norm_full")},
    # a query/key width other than n_embd/n_head (24 and 32 against 16): the q/k/v/o shapes transformers' load
    "model.head_size": (FAMILIES + "test_hf_load_equals_transformers_longer_than_the_window",
                        FAMILIES + "test_counts_match_the_model_and_transformers"),
    # only what export writes: the config.json's model_type, reloaded by transformers as that family's class
    "model.family": (FAMILIES + "test_export_hf_reloads_in_transformers",),
    "model.zero_init_proj": (LLAMA + "test_zero_init_proj_starts_each_block_as_identity",),
    "model.fused_ce": (LLAMA + "test_fused_ce_loss_and_grads_equal_the_plain_loss",
                       "tests/kernels/test_fused_ce_auto.py::test_auto_resolves_on_with_cuda_and_triton"),
    # the GPT-2 block's fused kernels: loss and every gradient against the plain ops (float64 references
    # for the kernels alone in the same file), under Triton's interpreter
    **{f"model.{k}": ("tests/kernels/test_fused_block.py::test_fused_block_kernels_against_float64_reference_interpreted",)
       for k in ("fused_ln_residual", "fused_bias_gelu")},
    "model.lm_head_fp8": (LLAMA + "test_fp8_lm_head_logits_close_to_plain",),
    "model.recompute": (GPT2 + "test_recompute_gives_same_gradients", LLAMA + "test_recompute_gives_the_same_gradients"),
    "model.flash": (GPT2 + "test_flash_and_math_attention_agree",),
    "model.pad_vocab": (GPT2 + "test_logits_match_transformers", GPT2 + "test_padded_vocab_gets_no_probability"),
    "model.attn_backend": ("tests/test_gpu_lane.py::test_attention_backend_matches_math_or_is_refused",),
    "model.arch": ("tests/cli/test_llama_cli.py::test_model_arch_override_and_bad_head_count",),
    **{f"model.{k}": (VARIANTS,) for k in ("rope_type", "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                                          "rope_original_context", "qkv_bias")},
    # data: document-aligned rows and document attention; shuffling
    **{k: (ALIGNED,) for k in ("data.align", "data.eot_token", "model.bos_token")},
    "model.attention": (ALIGNED, MASKS + "test_document_attention_equals_each_document_alone"),
    "model.doc_mask": (MASKS + "test_flex_attention_gives_the_same_loss_on_cpu",
                       MASKS + "test_llama_document_attention_equals_each_document_alone_and_flex_agrees"),
    "data.shuffle": ("tests/data/test_loader_shuffle.py::test_training_uses_shuffle_settings",),
    "data.shuffle_seed": ("tests/data/test_loader_shuffle.py::test_training_uses_shuffle_settings",),
    # parallel layouts, each against one process
    **{f"dist.{k}": (MP,) for k in ("tp", "pp", "pp_schedule", "dp_replicate")},
    "dist.shard": ("tests/training/test_distributed.py::test_zero1_and_fsdp_match_ddp_also_with_recompute",),
    "dist.pp_virtual": (MP, "tests/training/test_model_parallel.py::test_counted_traffic_equals_the_planner"),
    "dist.count_comm": ("tests/training/test_model_parallel.py::test_counted_traffic_equals_the_planner",),
    # recipes: a step against a hand computation
    "rl.scale_rewards": ("tests/training/test_grpo.py::test_scale_rewards_none_and_batch_by_hand",
                         RQ + "test_grpo_step_against_a_hand_computation"),
    "rl.adv_eps": (RQ + "test_grpo_step_against_a_hand_computation",),
    "dist.reshard_after_forward": ("tests/training/test_dist_keys_effect.py::"
                                   "test_reshard_after_forward_keeps_the_blocks_whole_after_a_forward_and_gathered_restores_it",),
    "dist.timeout": ("tests/training/test_dist_keys_effect.py::test_timeout_is_how_long_a_collective_waits_for_a_missing_rank",),
    "rl.resample_flat": ("tests/training/test_grpo_resample.py::test_each_flat_position_takes_the_first_redraw_that_is_not_flat",
                         "tests/training/test_grpo_resample.py::test_a_position_flat_in_every_round_keeps_its_first_group"),
    "rl.kl_horizon": (RQ + "test_grpo_adaptive_kl_moves_the_coefficient_by_the_controller",),
    "rl.reward_reduce": ("tests/training/test_preference_recipes.py::"
                         "test_reward_model_ensemble_is_the_members_mean_or_min_in_every_reader",),
    "rl.value_init": ("tests/training/test_ppo_experience.py::test_value_model_starts_from_the_reward_model",),
    "rm.center_coef": (PAIRQ + "test_rm_step_against_a_hand_computation",),
    "rm.use_margin": (PAIRQ + "test_rm_step_against_a_hand_computation",),
    "rm.grad_accum": (PAIRQ + "test_rm_step_against_a_hand_computation",),
    "dpo.grad_accum": (PAIRQ + "test_dpo_step_against_a_hand_computation",),
    "dpo.precompute_ref": ("tests/training/test_preference_recipes.py::test_dpo_resumes_exactly_with_cached_reference",
                           "tests/training/test_preference_recipes.py::test_a_cached_reference_belongs_to_its_reference_model"),
    # LoRA: adapters against peft's
    **{f"lora.{k}": (PEFT,) for k in ("rank", "alpha", "targets")},
    "lora.dropout": ("tests/training/test_lora_mutants.py::test_lora_dropout_reaches_the_adapters_of_a_run",
                     "tests/training/test_lora_edges.py::test_dropout_in_training_is_peft_s_on_the_adapter_input_with_its_gradients"),
    "lora.base": ("tests/training/test_lora.py::test_a_resume_or_load_on_another_base_is_refused",),
    # the run: counted from the settings
    **{f"train.{k}": (TRAINQ + "test_batch_logging_validation_and_sample_keys_shape_the_run",)
       for k in ("seq_len", "total_batch_tokens", "val_every", "val_tokens", "log_every", "sample_every",
                 "sample_tokens")},
    **{f"train.{k}": (TRAINQ + "test_the_batch_ramp_keys_set_each_steps_micro_batches",)
       for k in ("batch_warmup_steps", "batch_warmup_start")},
    **{f"eval.{k}": (TRAINQ + "test_the_eval_keys_score_those_tasks_at_those_steps",)
       for k in ("every", "tasks", "limit", "batch_tokens")},
    "data.dir": (TRAINQ + "test_data_dir_and_train_split_name_the_shards_training_reads",),
    "data.train_split": (TRAINQ + "test_data_dir_and_train_split_name_the_shards_training_reads",),
    "train.dtype": (TRAINQ + "test_dtype_bfloat16_computes_the_loss_under_bf16_autocast",),
    "dpo.max_new_tokens": ("tests/training/test_preference_units.py::test_dpo_max_new_tokens_caps_the_task_evals_replies",),
    "data.val_split": (TRAINQ + "test_val_split_names_the_shards_validation_reads",),
    "train.compile": (TRAINQ + "test_compile_reaches_torch_compile_on_the_run_path",),
    "train.compile_mode": ("tests/kernels/test_switches.py::test_compile_mode_reaches_torch_compile",
                           "tests/kernels/test_switches.py::test_compile_mode_is_validated_and_refused_where_it_would_measure_something_else"),
    "train.tf32": (TRAINQ + "test_tf32_sets_cudas_matmul_switches_and_names_the_precision",),
    "train.log_to": ("tests/run/test_sinks.py::test_tensorboard_has_the_metrics_jsonl_scalars",),
    "train.peak_flops": ("tests/bench/test_bench.py::test_bench_writes_json_with_phases_and_mfu",),
}

# keys a command-line flag sets (the CLI walk names that flag's effect tests)
FLAG_OF = {"train.out_dir": ("train", "--out"), "train.trust_checkpoint": ("train", "--trust-checkpoint"),
           "dpo.init_from": ("dpo", "--init-from"), "rl.init_from": ("rl", "--init-from")}

NOT_YET_MAX = 0  # may only shrink: a new key comes with its effect test, never a NOT_YET entry
# keys with no effect test yet: set and validated and saved, but no test shows what they change (none since
# 2026-11-28: the last two, dist.reshard_after_forward and dist.timeout, are in test_dist_keys_effect.py)
NOT_YET: set[str] = set()


def all_keys() -> set[str]:
    llama = Config()
    llama.model = LlamaConfig()
    return set(config_keys()) | set(config_keys(llama))


def through_flags() -> dict[str, set[str]]:
    """key -> the effect tests the CLI walk names for the flags that set it (its chain check left out)."""
    out: dict[str, set[str]] = {}
    pairs = [(cmd, flag, key) for cmd, flags in SHORT.items() for flag, (key, _) in flags.items()]
    pairs += [(cmd, flag, key) for key, (cmd, flag) in FLAG_OF.items()]
    for cmd, flag, key in pairs:
        tests = {t for t in EFFECTS.get((cmd, flag), ()) if t != CHAIN}
        if tests:
            out.setdefault(key, set()).update(tests)
    return out


def _test_source(node_id: str, cache: dict) -> tuple[str, str] | None:
    """(the test function's source, its file's) or None where the file has no such test."""
    path, name = node_id.split("::")
    if path not in cache:
        file = ROOT / path
        text = file.read_text() if file.is_file() else ""
        tree = ast.parse(text)
        cache[path] = {n.name: (ast.get_source_segment(text, n) or "", text) for n in tree.body
                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")}
    return cache[path].get(name)


def _names_key(source: str, key: str) -> bool:
    section, name = key.split(".", 1)
    return any(s in source for s in (f"{section}.{name}", f"{name}=", f'"{name}"', f"'{name}'"))


def test_every_config_key_has_an_effect_test():
    keys = all_keys()
    assert len(keys) > 140 and {"optim.beta1", "model.rope_type", "rl.scale_rewards"} <= keys  # both families
    flagged = through_flags()
    untested = sorted(k for k in keys if k not in KEY_EFFECTS and k not in flagged and k not in NOT_YET)
    assert not untested, ("config keys with no effect test (write one and add it to KEY_EFFECTS; see the module "
                          f"docstring): {untested}")
    assert not (set(KEY_EFFECTS) | NOT_YET | set(FLAG_OF)) - keys, "entries for keys Config does not have"
    tested = (set(KEY_EFFECTS) | set(flagged)) & NOT_YET
    assert not tested, f"tested now, take them out of NOT_YET: {sorted(tested)}"
    assert len(NOT_YET) <= NOT_YET_MAX, "NOT_YET only shrinks: a key needs an effect test, not a NOT_YET entry"
    print(f"\n{len(keys)} config keys: {len(set(KEY_EFFECTS) & keys)} with effect tests named here, "
          f"{len(set(flagged) - set(KEY_EFFECTS))} through a command's flag, {len(NOT_YET)} NOT_YET")


def test_each_named_test_exists_and_names_its_key():
    cache: dict = {}
    bad = []
    for key, tests in KEY_EFFECTS.items():
        assert tests, key
        for t in tests:
            source = _test_source(t, cache)
            if source is None:
                bad.append(f"{key}: {t} is no test function at the top level of its file")
            elif not (_names_key(source[0], key) or _names_key(source[1], key)):
                bad.append(f"{key}: neither {t} nor its file names the key")
    assert not bad, "\n".join(bad)
