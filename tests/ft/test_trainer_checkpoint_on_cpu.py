"""The FT trainer's pure parts: atomic checkpoints and GRPO advantages."""

import json
import os

import pytest

torch = pytest.importorskip("torch")

from verl_laminar.ft.trainer import grpo_advantages, latest_checkpoint, save_checkpoint  # noqa: E402


def test_checkpoint_pointer_moves_only_after_a_complete_write(tmp_path):
    d = str(tmp_path)
    assert latest_checkpoint(d) is None
    save_checkpoint(d, 1, {"w": torch.ones(2)}, {"g0": 1})
    save_checkpoint(d, 2, {"w": torch.zeros(2)}, {"g0": 1, "g1": 2})
    save_checkpoint(d, 3, {"w": torch.zeros(2)}, {"g0": 1, "g1": 2, "g2": 3})
    cur = latest_checkpoint(d)
    assert cur.endswith("step-000003")
    with open(os.path.join(cur, "meta.json")) as f:
        assert json.load(f) == {"step": 3, "trained": {"g0": 1, "g1": 2, "g2": 3}}
    assert sorted(x for x in os.listdir(d) if x.startswith("step-")) == ["step-000002", "step-000003"]
    # a crash mid-write leaves a .tmp folder and the pointer where it was
    os.makedirs(os.path.join(d, ".tmp-step-000004"))
    assert latest_checkpoint(d) == cur


def test_grpo_advantages_standardise_within_the_group():
    adv = grpo_advantages([1.0, 0.0, 1.0, 0.0])
    assert adv == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-5)
    assert grpo_advantages([0.5, 0.5]) == [0.0, 0.0]
