"""The FT trainer's state in verl's form: verl checkpoints (FSDP2 + AdamW) that a killed process resumes from."""

import os

import pytest
import torch
import verl  # noqa: F401

from verl_laminar.ft.verl_state import TRAINED_FILE, VerlPolicyState, step_dir  # noqa: E402


def _seqs(vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    out = []
    for gi in range(2):
        for j in range(4):
            prompt = torch.randint(3, vocab, (6,), generator=g).tolist()
            resp = torch.randint(3, vocab, (3 + j,), generator=g).tolist()
            out.append((prompt + resp, len(prompt), [-7.0] * len(resp), float(j % 2), gi))
    return out


@pytest.fixture(scope="module")
def model_dir():
    from verl_laminar.fixtures import model_dir as fixture

    return str(fixture())


def _flat(state: VerlPolicyState) -> torch.Tensor:
    return torch.cat([v.flatten() for _, v in state.full_weights()])


def test_verl_checkpoint_resume_restores_weights_optimizer_and_trained_groups(tmp_path, model_dir):
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    d = str(tmp_path)
    a = VerlPolicyState(model_dir, d, lr=1e-3)
    assert a.step == 0 and a.resumed_from is None
    vocab = a.model.config.vocab_size
    w0 = _flat(a)
    trained = {}
    for step in (1, 2, 3):
        info = a.train_step(_seqs(vocab, step), micro_batch=4)
        assert info["tokens"] == sum(3 + j for j in range(4)) * 2 and torch.isfinite(torch.tensor(info["loss"]))
        trained[f"g{step}"] = step
        a.save(step, dict(trained))
    assert not torch.equal(w0, _flat(a)), "three AdamW steps must move the weights"
    # verl's layout: its tracker names step 3, its manager's files are there, older steps are pruned
    assert find_latest_ckpt_path(d) == step_dir(d, 3)
    names = os.listdir(os.path.join(step_dir(d, 3), "actor"))
    assert {"model_world_size_1_rank_0.pt", "optim_world_size_1_rank_0.pt",
            "extra_state_world_size_1_rank_0.pt"} <= set(names)
    assert sorted(x for x in os.listdir(d) if x.startswith("global_step_")) == ["global_step_2", "global_step_3"]

    # a process killed while writing step 4 leaves a torn folder and the tracker on step 3
    os.makedirs(os.path.join(step_dir(d, 4), "actor"))
    b = VerlPolicyState(model_dir, d, lr=1e-3)
    assert b.resumed_from == step_dir(d, 3) and b.step == 3 and b.trained == trained
    assert torch.equal(_flat(a), _flat(b))
    moments = [st["exp_avg"] for st in a.opt.state.values()]
    assert moments and all(torch.equal(x.full_tensor() if hasattr(x, "full_tensor") else x,
                                       y.full_tensor() if hasattr(y, "full_tensor") else y)
                           for x, y in zip(moments, [st["exp_avg"] for st in b.opt.state.values()]))
    # the resumed process takes the same next step as the one that was never killed
    a.train_step(_seqs(vocab, 4), micro_batch=4)
    b.train_step(_seqs(vocab, 4), micro_batch=4)
    assert torch.allclose(_flat(a), _flat(b), atol=1e-6)
    b.save(4, dict(trained, g4=4))
    with open(os.path.join(step_dir(d, 4), TRAINED_FILE)) as f:
        assert '"g4": 4' in f.read()


def test_a_step_with_equal_rewards_teaches_nothing(tmp_path, model_dir):
    """GRPO (verl's advantage): rewards all equal within each group give zero advantage, so no gradient."""
    s = VerlPolicyState(model_dir, str(tmp_path), lr=1e-2)
    seqs = [(ids, start, lp, 1.0, gi) for ids, start, lp, _, gi in _seqs(s.model.config.vocab_size, 0)]
    w0 = _flat(s)
    info = s.train_step(seqs, micro_batch=3)
    assert info["loss"] == pytest.approx(0.0, abs=1e-7)
    assert torch.equal(w0, _flat(s))


def test_keep_below_two_is_refused(tmp_path, model_dir):
    with pytest.raises(ValueError, match="keep at least 2"):
        VerlPolicyState(model_dir, str(tmp_path), lr=1e-3, keep=1)
