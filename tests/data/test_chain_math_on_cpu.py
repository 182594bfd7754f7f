"""The chain-sum set: seeded rows in verl's DAPO layout, three disjoint splits, long-tailed solution lengths."""

from __future__ import annotations

import re
from dataclasses import asdict, fields

import numpy as np
import pandas as pd
import pytest

from verl_laminar.data import chain_math_path
from verl_laminar.data.chain_math import (
    MAX_PROMPT_TOKENS,
    MAX_RESPONSE_TOKENS,
    MAX_STEPS,
    SIZES,
    SLIP,
    SLIP_MIN_ADD,
    SPLITS,
    make_splits,
    solution_text,
    teacher_rows,
    write,
)

LINE = re.compile(r"^(\d+)\) (\d+) \+ (\d) = (\d+)$")
PROBLEM = re.compile(r"^Start at (\d+) and keep adding (\d)\. Additions: (\d+)\.")


@pytest.fixture(scope="module")
def splits() -> dict[str, list[dict]]:
    return make_splits()


def _tail(values) -> float:
    return float(np.percentile(values, 99) / np.percentile(values, 50))


def test_generation_is_deterministic_and_seeded(splits):
    assert make_splits() == splits
    assert make_splits(seed=7)["dev"] != splits["dev"]
    assert {s: len(r) for s, r in splits.items()} == SIZES
    for split, rows in splits.items():
        assert [r["extra_info"]["index"] for r in rows] == list(range(len(rows)))
        assert {r["extra_info"]["split"] for r in rows} == {split}


def test_no_problem_is_shared_between_splits_or_repeated_in_dev_or_heldout(splits):
    texts = {s: [r["prompt"][0]["content"] for r in rows] for s, rows in splits.items()}
    for split in ("dev", "heldout"):  # train may repeat its own short problems (few exist), never theirs
        assert len(set(texts[split])) == len(texts[split]), split
    assert not set(texts["heldout"]) & (set(texts["train"]) | set(texts["dev"]))
    assert not set(texts["dev"]) & set(texts["train"])


def test_steps_and_solution_lengths_are_long_tailed(splits):
    for split, rows in splits.items():
        steps = [r["extra_info"]["steps"] for r in rows]
        assert min(steps) >= 1 and max(steps) <= MAX_STEPS
        assert _tail(steps) >= 5, split
        # characters as a tokenizer-free proxy of tokens (digits are one token each in Qwen's vocabulary)
        assert _tail([len(r["extra_info"]["solution"]) for r in rows]) >= 5, split
    train_steps = [r["extra_info"]["steps"] for r in splits["train"]]
    assert np.median(train_steps) <= 4 and np.percentile(train_steps, 99) >= 20


def test_every_worked_solution_adds_up_and_counts_down_to_one(splits):
    for rows in splits.values():
        for row in rows:
            assert row["data_source"] == "math_dapo" and row["prompt"][0]["role"] == "user"
            gt = row["reward_model"]["ground_truth"]
            *lines, last = row["extra_info"]["solution"].split("\n")
            start, add, steps = map(int, PROBLEM.search(row["prompt"][0]["content"]).groups())
            assert last == f"Answer: {gt}" and len(lines) == steps == row["extra_info"]["steps"]
            total = start
            for left, line in zip(range(steps, 0, -1), lines):
                assert tuple(map(int, LINE.match(line).groups())) == (left, total, add, total + add)
                total += add
            assert str(total) == gt


def test_verls_math_dapo_scorer_grades_the_answer_line(splits):
    from verl.utils.reward_score import default_compute_score

    for rows in splits.values():
        for row in rows:
            gt = row["reward_model"]["ground_truth"]
            right = default_compute_score("math_dapo", row["extra_info"]["solution"], gt)
            assert (right["score"], right["acc"]) == (1.0, True)
    for row in splits["heldout"][:16]:
        gt, solution = row["reward_model"]["ground_truth"], row["extra_info"]["solution"]
        wrong = default_compute_score("math_dapo", solution.replace(f"Answer: {gt}", f"Answer: {int(gt) + 1}"), gt)
        assert (wrong["score"], wrong["acc"]) == (-1.0, False)  # math_dapo's wrong answer: reward -1, accuracy 0
        cut = default_compute_score("math_dapo", solution.rsplit("\n", 1)[0], gt)  # no answer line: wrong too
        assert cut["acc"] is False


def test_committed_parquet_equals_the_generator_output(tmp_path):
    write(tmp_path)
    for split in SPLITS:
        committed, fresh = pd.read_parquet(chain_math_path(split)), pd.read_parquet(tmp_path / f"{split}.parquet")
        assert committed.to_json(orient="records") == fresh.to_json(orient="records"), split
        assert chain_math_path(split).stat().st_size < 500_000


def test_split_rejects_unknown_name():
    with pytest.raises(ValueError, match="'val'"):
        chain_math_path("val")


def test_prompts_and_solutions_fit_the_recipe_limits_in_qwen_tokens(splits, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    for split, rows in splits.items():
        chats = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
        prompts = [len(tok.encode(chat, add_special_tokens=False)) for chat in chats]
        answers = [len(tok.encode(r["extra_info"]["solution"] + tok.eos_token, add_special_tokens=False))
                   for r in rows]
        assert 60 <= max(prompts) <= MAX_PROMPT_TOKENS and max(answers) <= MAX_RESPONSE_TOKENS, split
        assert _tail(answers) >= 5, split


def test_tiny_chain_spec_differs_from_tiny_qwen_only_where_intended():
    from verl_laminar.fixtures import FIXTURES
    from verl_laminar.fixtures.__main__ import DATASETS
    from verl_laminar.fixtures.model import TinyModelSpec, spec_dict, spec_for

    assert FIXTURES["tiny-chain"] == FIXTURES["tiny-qwen"] == "npm"  # the same Qwen tokenizer
    qwen, chain = asdict(spec_for("tiny-qwen")), asdict(spec_for("tiny-chain"))
    changed = {k for k in qwen if qwen[k] != chain[k]}
    shape = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "max_position_embeddings", "seed"}
    assert not changed & shape  # the same model
    assert changed == {"data", "eval_max_new_tokens", "eval_batch", "sft_active_vocab", "sft_greedy_gate", "sft_steps",
                       "sft_cycle_steps", "target_val_acc", "target_val_acc_max",
                       "sft_teacher_slip", "sft_teacher_draws"}
    assert chain["eval_max_new_tokens"] == MAX_RESPONSE_TOKENS
    assert chain["target_val_acc"] < chain["target_val_acc_max"] <= 0.6
    # one long cosine that ends where training does: the warm start has converged on the teacher
    assert chain["sft_cycle_steps"] == chain["sft_steps"] and chain["sft_teacher_slip"] == SLIP
    # the warm start trains on train and stops on dev; held-out is only measured after the build
    assert DATASETS[chain["data"]] == ("train", "dev", "heldout")
    # the cached tiny-qwen and tiny-bpe manifests record the spec without the later fields: still matching
    later = {"data", "eval_max_new_tokens", "eval_batch", "sft_active_vocab", "target_val_acc_max", "sft_greedy_gate",
             "sft_teacher_slip", "sft_teacher_draws"}
    first = {f.name for f in fields(TinyModelSpec)} - later
    assert set(spec_dict(spec_for("tiny-qwen"))) == set(spec_dict(spec_for("tiny-bpe"))) == first
    assert spec_dict(spec_for("tiny-chain"))["data"] == "chain_math"


def test_active_vocabulary_sft_is_the_full_softmax_and_keeps_the_other_rows_zero(splits, tiny_model_dir):
    """tiny-chain's warm start trains the softmax over the few dozen tokens the data uses: the same loss as the
    full 151,680-way softmax of a model whose other rows are zero, and those rows stay zero through training."""
    from dataclasses import replace

    import torch
    import torch.nn.functional as F
    from transformers import AutoTokenizer

    from verl_laminar.fixtures.model import ActiveVocab, _encode, _sft_batch, build_model, sft_warm_start, spec_for

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    rows = splits["train"][:8]
    spec = replace(spec_for("tiny-chain"), num_hidden_layers=1, sft_steps=2, sft_batch=4)
    model = build_model(tok, spec)
    pairs = _encode(tok, rows)
    vocab = ActiveVocab(model, pairs, tok)
    vocab.write_back()
    with torch.no_grad():
        ids, mask, target_pos = _sft_batch(pairs, list(range(4)), tok.pad_token_id)
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        full = F.cross_entropy(model.lm_head(hidden[target_pos]).float(), ids[:, 1:][target_pos[:, :-1]])
        local = _sft_batch(vocab.remap(pairs), list(range(4)), int(vocab.local[tok.pad_token_id]))
        part, count = vocab.loss_sum(model, *local)
    assert part.item() / count == pytest.approx(full.item(), rel=1e-5)

    before = model.get_input_embeddings().weight.detach()[vocab.active].clone()
    sft_warm_start(model, tok, rows, spec)
    weight = model.get_input_embeddings().weight.detach()
    inactive = torch.ones(weight.shape[0], dtype=torch.bool)
    inactive[vocab.active] = False
    assert not weight[inactive].any()
    assert not torch.equal(weight[vocab.active], before)


def test_compact_model_decodes_and_samples_as_the_full_model(splits, tiny_model_dir):
    """The warm start's evaluations run on the active rows plus one zero row; untrained, the full model often
    prefers an inactive token (all its active logits below 0), so the zero row's stand-in is exercised too."""
    from dataclasses import replace

    import torch
    from transformers import AutoTokenizer

    from verl_laminar.fixtures.__main__ import sampling_twin
    from verl_laminar.fixtures.model import (
        ActiveVocab,
        LocalTokenizer,
        _encode,
        _sft_batch,
        build_model,
        exact_share,
        generate,
        spec_for,
    )

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    rows = splits["dev"][:4]
    model = build_model(tok, replace(spec_for("tiny-chain"), num_hidden_layers=1)).eval()
    pairs = _encode(tok, splits["train"][:32])
    vocab = ActiveVocab(model, pairs, tok)
    vocab.write_back()
    full_texts, full_lengths = generate(model, tok, rows, 12, 4)
    compact, local_tok = vocab.compact_model(model), LocalTokenizer(tok, vocab)
    assert generate(compact, local_tok, rows, 12, 4) == (full_texts, full_lengths)
    assert exact_share(compact, vocab.remap(pairs), int(vocab.local[tok.pad_token_id])) == 0.0  # untrained

    # sampling: the twin's distribution is the full model's, the inactive tokens' mass on the zero row
    ids, mask, _ = _sft_batch(pairs, [0, 1], tok.pad_token_id)
    local_ids, local_mask, _ = _sft_batch(vocab.remap(pairs), [0, 1], int(vocab.local[tok.pad_token_id]))
    with torch.no_grad():
        # float64: a float32 softmax over 151,680 logits is itself off by ~1e-4
        full = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.double(), -1)
        twin_logits = sampling_twin(compact, vocab)(input_ids=local_ids, attention_mask=local_mask).logits
        twin = torch.log_softmax(twin_logits.double(), -1)
    real = mask.bool()
    assert torch.allclose(twin[..., :-1][real], full[..., vocab.active][real], atol=1e-4)
    inactive = torch.logsumexp(full[..., vocab.local < 0], -1)
    assert torch.allclose(twin[..., -1][real], inactive[real], atol=1e-4)


def _carry_lines(start: int, add: int, steps: int) -> int:
    total, n = start, 0
    for _ in range(steps):
        n += total % 10 + add >= 10 and add >= SLIP_MIN_ADD
        total += add
    return n


def test_the_teacher_slips_only_on_carrying_lines_at_its_rate_and_keeps_the_gold_answer(splits):
    train = splits["train"][:400]
    drawn = teacher_rows(train, draws=4, seed=7)
    assert drawn == teacher_rows(train, draws=4, seed=7)  # seeded
    assert len(drawn) == 4 * len(train)
    slipped = eligible = 0
    for i, row in enumerate(drawn):
        gold = train[i // 4]
        assert row["reward_model"] == gold["reward_model"] and row["prompt"] == gold["prompt"]
        start, add, steps = (int(x) for x in PROBLEM.match(gold["extra_info"]["problem"]).groups())
        lines = row["extra_info"]["solution"].split("\n")
        assert len(lines) == steps + 1
        total = start
        for left, line in zip(range(steps, 0, -1), lines):
            n, a, b, c = (int(x) for x in LINE.match(line).groups())
            assert (n, a, b) == (left, total, add)  # it copies its own last total and counts down
            if total % 10 + add >= 10 and add >= SLIP_MIN_ADD:
                eligible += 1
                slipped += c == total + add - 10
                assert c in (total + add, total + add - 10)
            else:
                assert c == total + add  # never slips elsewhere
            total = c
        assert lines[-1] == f"Answer: {total}"
        if _carry_lines(start, add, steps) == 0:  # nothing to slip on: the gold solution, word for word
            assert row["extra_info"]["solution"] == solution_text(start, add, steps)
    assert eligible > 500 and abs(slipped / eligible - SLIP) < 0.05
    assert teacher_rows(train[:50], draws=1, slip=0.0) == [
        {**r, "extra_info": {**r["extra_info"], "solution": solution_text(*(
            int(x) for x in PROBLEM.match(r["extra_info"]["problem"]).groups()))}} for r in train[:50]]
