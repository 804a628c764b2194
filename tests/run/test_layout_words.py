"""Messages about a parallel layout name the layout that ran (issue 34): meta.json's ``sharding``
in words, a pipeline checkpoint's trust refusal, and no torch warning when one process reads a DCP
checkpoint back on purpose."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import pytest
import torch

from gptforge.errors import CheckpointError
from gptforge.parallel.distributed import DistInfo, layout_words
from gptforge.run.identity import require_trust


@pytest.mark.parametrize("sharding, words", [
    ("fsdp", "FSDP"), ("zero1", "ZeRO-1"), ("pp1.dp1x1.tp2", "tensor parallel (dist.tp 2)"),
    ("pp2.dp1x1.tp1", "pipeline parallel (dist.pp 2)"),
    ("pp2.dp1x2.tp2", "tensor parallel (dist.tp 2) + pipeline parallel (dist.pp 2) + FSDP over 2"),
])
def test_layout_words(sharding, words):
    assert layout_words(sharding) == words


def test_dist_info_says_the_mesh_that_runs():
    assert DistInfo(mesh=SimpleNamespace(shape=(1, 1, 1, 2)), fsdp=True).layout == "tensor parallel (dist.tp 2)"
    assert DistInfo(world=2, fsdp=True).layout == "FSDP"


def test_a_pipeline_checkpoints_trust_refusal_does_not_call_it_fsdp(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps({"step": 5, "sharding": "pp2.dp1x1.tp1"}))
    with pytest.raises(CheckpointError) as e:
        require_trust(tmp_path, trusted=False)
    assert "FSDP" not in str(e.value) and "pipeline parallel (dist.pp 2)" in str(e.value)
    assert "--trust-checkpoint" in str(e.value)


def test_reading_a_dcp_checkpoint_on_one_process_is_quiet(tmp_path):
    import torch.distributed.checkpoint as dcp

    from gptforge.run.dcp import _read_full_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model.w": torch.arange(6.0)}, checkpoint_id=str(tmp_path), no_dist=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = _read_full_model(tmp_path)
    assert torch.equal(got["w"], torch.arange(6.0))
    assert not [w for w in seen if "torch.distributed is disabled" in str(w.message)]
