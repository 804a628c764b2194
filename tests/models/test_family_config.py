"""Every registered family's config inherits the checks all families share (models/family.py), so a new
family cannot forget one: each is refused with the same message that names the field."""

from __future__ import annotations

import pytest

from gptforge.models.family import FamilyConfig
from gptforge.models.registry import FAMILIES

SHARED = [  # (override, what the message must say)
    ({"n_layer": 0}, "model.n_layer=0 must be >= 1"),
    ({"n_embd": 10**9}, "model.n_embd=1000000000 must be at most"),
    ({"n_embd": 100, "n_head": 3}, "model.n_embd=100 must be divisible by model.n_head=3"),
    ({"bos_token": -1}, "model.bos_token=-1 must be a token id"),
    ({"recompute": "all"}, "model.recompute='all'; allowed: none, mlp, block"),
    ({"dropout": 1.0}, "model.dropout=1.0 must be in [0, 1)"),
    ({"attn_backend": "nope"}, "model.attn_backend='nope'; allowed:"),
    ({"attn_backend": "math", "flash": False}, "it needs model.flash=true"),
    ({"fused_ce": True, "lm_head_fp8": True}, "model.fused_ce and model.lm_head_fp8 cannot be combined"),
    ({"attention": "sideways"}, "model.attention"),
]


@pytest.mark.parametrize("arch", sorted(FAMILIES))
@pytest.mark.parametrize("override, says", SHARED, ids=[next(iter(o)) for o, _ in SHARED])
def test_every_family_refuses_what_all_families_share(arch, override, says):
    cls = FAMILIES[arch].config_cls
    assert issubclass(cls, FamilyConfig)
    with pytest.raises(ValueError) as e:
        cls(**override)
    assert says in str(e.value)


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_a_config_of_another_arch_is_refused_by_name(arch):
    other = next(a for a in FAMILIES if a != arch)
    with pytest.raises(ValueError, match=rf"model.arch='{other}' given to \w+; it only describes arch '{arch}'"):
        FAMILIES[arch].config_cls(arch=other)
