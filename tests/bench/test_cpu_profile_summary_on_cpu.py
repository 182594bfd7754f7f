"""bench.cpu_profile's summary: medians over rounds of ratios paired within each round (no engines run here)."""

from verl_laminar.bench.cpu_profile import PHASES, schedule, summarize


def _raw(rounds: int, solo_decode: list[float], solo_train: list[float]) -> dict:
    raw = {}
    for label, phase, members in schedule(rounds):
        r = int(label.split("#")[1])
        recs = {}
        for m in members:
            if phase == "engine":
                recs[m] = {"decode_step_s": {"64": {"1": 0.01}}, "prefill_s_per_token": {"1": 1e-5},
                           "weight_load_s": 0.2, "weight_bytes": 10}
            elif m.startswith("e"):
                # a co-run window is twice its round's solo window
                recs[m] = {"step_s": solo_decode[r] * (1 if phase == "decode_1" else 2)}
            else:
                solo = phase in ("train_1", "fwd_1", "train_2", "fwd_2") or phase.endswith("_long")
                recs[m] = {"s_per_token": solo_train[r] * (1 if solo else 1.5) * (3 if phase.endswith("_long") else 1)}
        raw[label] = recs
    return raw


def test_the_engine_profile_runs_once_and_the_rest_every_round():
    plan = schedule(3)
    assert [p for _, p, _ in plan].count("engine") == 1
    assert len(plan) == 1 + 3 * (len(PHASES) - 1)
    assert len({label for label, _, _ in plan}) == len(plan)


def test_slowdowns_are_paired_within_a_round_so_drift_cancels():
    # the solo windows drift 60% from round to round; each round's co-run window drifts with them
    prof = summarize(_raw(3, [0.010, 0.016, 0.012], [0.002, 0.0032, 0.0024]))
    assert prof["decode_slowdown"]["2"] == 2.0 and prof["decode_slowdown"]["4"] == 2.0
    assert prof["train_slowdown"]["2"] == 1.5
    assert prof["train_s_per_token"]["1"] == 0.0024  # the median solo window
    assert abs(prof["train_s_per_token_long"]["2"] - 0.0072) < 1e-12  # at the padded length, its own window
    assert prof["train_settings"]["long_seq_tokens"] == 2048
    assert prof["rounds"] == 3 and prof["per_round"]["decode_1"] == [0.01, 0.016, 0.012]
