"""What every model family's config is checked for, in one place: a family's config subclasses
:class:`FamilyConfig` and so inherits these checks by construction; it adds only its own fields' checks.

    >>> GPTConfig(n_embd=100, n_head=3)
    ValueError: model.n_embd=100 must be divisible by model.n_head=3

Every message names the field (``model.KEY``, as the command line spells it) and what to do.
"""

from __future__ import annotations

from dataclasses import fields

from gptforge.kernels.attention import BACKENDS
from gptforge.models import masks
from gptforge.models.head import padded_vocab
from gptforge.numbers import MAX_DIM

SIZE_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")  # every family's sizes
RECOMPUTE = ("none", "mlp", "block")


class FamilyConfig:
    """A mixin for a family's ``@dataclass`` config: ``__post_init__`` runs the checks every family shares
    (its arch, the sizes, heads dividing the width, the document-start token, dropout, the speed switches,
    the attention mask), then the family's :meth:`check_family`. A family with its own head size (a
    ``head_size`` field, 0 = derived) is not asked for n_embd divisible by n_head when it sets one."""

    def __post_init__(self) -> None:
        self._check_shared()
        self.check_family()

    def check_family(self) -> None:
        """The checks of the fields this family adds (none by default)."""

    def _check_shared(self) -> None:
        arch = next(f.default for f in fields(self) if f.name == "arch")  # a family's arch is its field's default
        if self.arch != arch:
            raise ValueError(f"model.arch={self.arch!r} given to {type(self).__name__}; it only describes arch {arch!r}")
        for key in SIZE_FIELDS:
            if getattr(self, key) < 1:
                raise ValueError(f"model.{key}={getattr(self, key)} must be >= 1")
            # a width past any model's: a damaged meta.json or a typo, refused before torch's size arithmetic
            # overflows on it (n_layer only repeats blocks: plan costs a billion of them; a file bounds its own)
            if key != "n_layer" and getattr(self, key) > MAX_DIM:
                raise ValueError(f"model.{key}={getattr(self, key)} must be at most {MAX_DIM} (no model is that big)")
        if self.bos_token < 0 or (self.attention == "document" and self.bos_token >= self.vocab_size):
            raise ValueError(f"model.bos_token={self.bos_token} must be a token id in [0, model.vocab_size)")
        has_head_size = hasattr(self, "head_size")
        if not getattr(self, "head_size", 0) and self.n_embd % self.n_head != 0:
            raise ValueError(f"model.n_embd={self.n_embd} must be divisible by model.n_head={self.n_head}"
                             + (" (or set model.head_size)" if has_head_size else ""))
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"model.recompute={self.recompute!r}; allowed: {', '.join(RECOMPUTE)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout={self.dropout} must be in [0, 1)")
        if self.attn_backend not in BACKENDS:
            raise ValueError(f"model.attn_backend={self.attn_backend!r}; allowed: {', '.join(BACKENDS)}")
        if self.attn_backend != "auto" and not self.flash:
            raise ValueError(f"model.attn_backend={self.attn_backend} picks an SDPA kernel; it needs model.flash=true")
        if self.fused_ce and self.lm_head_fp8:
            raise ValueError("model.fused_ce and model.lm_head_fp8 cannot be combined yet; switch one off")
        masks.check_config(self.attention, self.doc_mask)

    @property
    def padded_vocab_size(self) -> int:
        return padded_vocab(self.vocab_size) if self.pad_vocab else self.vocab_size

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
