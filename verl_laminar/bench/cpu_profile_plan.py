"""What ``bench.cpu_profile`` measures and how its windows become the simulator's profile (pure: no processes).

The phases, their schedule over rounds, and ``summarize``: medians over rounds of ratios paired within each round.
"""

from __future__ import annotations

ENGINE_KV_BYTES = 256 << 20  # recipes/cpu/common.sh KV_BYTES
ENGINE_MAX_SEQS = 32  # recipes/cpu/common.sh rollout.max_num_seqs
DECODE_BATCHES = (1, 2, 4, 8)
CORUN_BATCH = 4  # a replica's share of the paper workload's 8 trajectories over 2 replicas
LONG_PROMPT = 1024  # the second context length of the decode profile; the paper workload reaches ~2K
TRAIN_SEQ_TOKENS = 512  # a prompt plus a mean-length response of the paper workload is ~420 tokens
LONG_SEQ_TOKENS = 2048  # the paper workload padded: a 128-token prompt plus its 1,900-token response cap
TRAIN_SEQS = 8  # the paper workload trains 8 trajectories per step
TRAIN_MICRO = 2  # its micro-batch per rank
MIN_UPDATES = 3  # a trainer phase measures at least this many updates (the median is reported)

# (phase, workers that run in it); workers: e0-e3 (engines), t0, t1 (trainer ranks)
PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("engine", ("e0",)),
    ("decode_1", ("e0",)),
    ("decode_2", ("e0", "e1")),
    ("decode_4", ("e0", "e1", "e2", "e3")),
    ("train_1", ("t0",)),
    ("fwd_1", ("t0",)),
    ("train_1_decode_1", ("t0", "e0")),
    ("train_1_decode_2", ("t0", "e0", "e1")),
    ("train_2", ("t0", "t1")),
    ("fwd_2", ("t0", "t1")),
    ("train_1_long", ("t0",)),
    ("fwd_1_long", ("t0",)),
    ("train_2_long", ("t0", "t1")),
    ("fwd_2_long", ("t0", "t1")),
)


def schedule(rounds: int) -> list[tuple[str, str, tuple[str, ...]]]:
    """(label, phase, members) in the order run: the engine profile once, the co-run phases ``rounds`` times.

    Repeating the whole sequence and pairing each co-run window with the solo window of its own round is
    what keeps drift out of the slowdowns: solo windows on this shared machine were seen to differ by 60%
    from one run to the next."""
    out = []
    for r in range(rounds):
        out += [(f"{ph}#{r}", ph, m) for ph, m in PHASES if r == 0 or ph != "engine"]
    return out


# phases whose name says what the engines or trainers do there
FWD_PHASES = {"fwd_1", "fwd_2", "fwd_1_long", "fwd_2_long"}
TWO_RANK_PHASES = {"train_2", "fwd_2", "train_2_long", "fwd_2_long"}


def summarize(raw: dict) -> dict:
    """The profile the simulator reads: solo costs and co-run slowdowns, each the median over the rounds of
    a ratio of two windows of the same round. ``raw`` is keyed by phase label (``<phase>#<round>``)."""
    rounds = sorted({int(k.split("#")[1]) for k in raw})

    def val(phase: str, name: str, key: str, r: int) -> float:
        return float(raw[f"{phase}#{r}"][name][key])

    def med(xs: list[float]) -> float:
        xs = sorted(xs)
        n = len(xs)
        return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])

    def dec(phase: str) -> float:  # a decode window over the solo one of its round
        return med([val(phase, "e0", "step_s", r) / val("decode_1", "e0", "step_s", r) for r in rounds])

    def tr(phase: str) -> float:
        return med([val(phase, "t0", "s_per_token", r) / val("train_1", "t0", "s_per_token", r) for r in rounds])

    def solo(phase: str, name: str, key: str) -> float:
        return med([val(phase, name, key, r) for r in rounds])

    eng = raw["engine#0"]["e0"]
    spread = {ph: [round(val(ph, "t0" if ph.startswith(("train", "fwd")) else "e0",
                             "s_per_token" if ph.startswith(("train", "fwd")) else "step_s", r), 6) for r in rounds]
              for ph, _ in PHASES if ph != "engine"}
    return {
        "decode_step_s": eng["decode_step_s"],
        "prefill_s_per_token": eng["prefill_s_per_token"],
        "weight_load_s": eng["weight_load_s"],
        "weight_bytes": eng["weight_bytes"],
        "corun_batch": CORUN_BATCH,
        "rounds": len(rounds),
        "decode_solo_step_s": solo("decode_1", "e0", "step_s"),
        # slowdown of a decode step beside other busy processes ("3": two engines and one trainer rank)
        "decode_slowdown": {"1": 1.0, "2": dec("decode_2"), "4": dec("decode_4"), "3": dec("train_1_decode_2"),
                            "2_with_trainer": dec("train_1_decode_1")},
        "train_s_per_token": {"1": solo("train_1", "t0", "s_per_token"), "2": solo("train_2", "t0", "s_per_token")},
        "forward_s_per_token": {"1": solo("fwd_1", "t0", "s_per_token"), "2": solo("fwd_2", "t0", "s_per_token")},
        # the same at LONG_SEQ_TOKENS per sequence (verl's padded length on CPU)
        "train_s_per_token_long": {"1": solo("train_1_long", "t0", "s_per_token"),
                                   "2": solo("train_2_long", "t0", "s_per_token")},
        "forward_s_per_token_long": {"1": solo("fwd_1_long", "t0", "s_per_token"),
                                     "2": solo("fwd_2_long", "t0", "s_per_token")},
        "train_slowdown": {"1": 1.0, "2": tr("train_1_decode_1"), "3": tr("train_1_decode_2")},
        # every round's value of each window, so the run-to-run spread is on record beside the medians
        "per_round": spread,
        "train_settings": {"seq_tokens": TRAIN_SEQ_TOKENS, "long_seq_tokens": LONG_SEQ_TOKENS, "seqs": TRAIN_SEQS, "micro_batch": TRAIN_MICRO,
                           "threads_per_rank": 1, "dtype": "float32 + bf16 autocast"},
        "engine_settings": {"dtype": "bfloat16", "kv_cache_bytes": ENGINE_KV_BYTES, "max_num_seqs": ENGINE_MAX_SEQS,
                            "enforce_eager": True},
    }
