"""``python -m verl_laminar.sim --validate --json``: the simulator's predictions for our CPU runs beside them.

Dataflow: the newest committed ``docs/results/cpu_profile_*.json`` (micro benchmarks, ``bench.cpu_profile``)
-> ``sim.cpu.CpuProfile`` -> the CPU end-to-end benchmark's workload and placement, read from the newest
``docs/results/bench_e2e*_paper_*.json`` (prompts per step, group size, the length distribution, each mode's
trainer ranks and replicas) -> every mode simulated over ``seeds`` draws of that workload -> each predicted
ratio beside the measured one, with its error; and the repack gain beside ``bench_repack_*.json``.

Only the micro benchmarks set costs; the end-to-end and repack files give the workload, the placement and
the numbers to predict, never a cost. The ``dedicated_cores`` counterfactual reruns every prediction with
the co-run slowdowns set to 1 (each process on cores of its own, as on a GPU cluster), which is what says
why asynchrony gains little on two shared cores.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
from pathlib import Path
from typing import Optional

import numpy as np

from verl_laminar import metrics as lm
from verl_laminar.policy.lengths import SkewedLengths
from verl_laminar.sim.cpu import CpuProfile, fit_decode, load_profile
from verl_laminar.sim.lengths import Empirical
from verl_laminar.sim.params import Inference, Schedule, SimParams, Task
from verl_laminar.sim.systems import Layout, Setup, simulate

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"
TOLERANCE = 0.20  # issue: each predicted ratio within 20% of its measured value
REPACK_TOLERANCE = 0.15  # and the repack gain within 0.15
# bench.e2e's Laminar keeps trainer.v1.laminar.num_warmup_batches batches ahead of the trainer (its placement
# records how many; 3 before it did): one generating, the rest may wait finished in the buffer
LAMINAR_AHEAD_BATCHES = 3
GROUPS_PER_BATCH_KEY = "laminar.dispatch.groups_per_batch"
E2E_PATTERN = "bench_e2e*_paper_*.json"  # bench.e2e --results under any --name
E2E_SYSTEMS = {"laminar": "laminar", "sync": "sync", "sync_bypass": "sync_bypass", "separate_async": "separate_async"}
# the CPU platform's default repack interval (config.platform_defaults): a round every 1.0 s
E2E_REPACK_INTERVAL_S = 1.0
# the batches whose longest response is averaged for the padded length (``batch_padded_len``)
PADDED_LEN_DRAWS = 4096
# a repack on CPU aborts the source's requests and resubmits them on the target (policy.migration); when no
# repack benchmark file gives its measured duration, this -- assumption
DEFAULT_REPACK_PAUSE_S = 0.05


def newest(pattern: str, results: Path = RESULTS) -> Path:
    found = sorted(results.glob(pattern))
    if not found:
        raise FileNotFoundError(f"no {results.name}/{pattern}: run the benchmark that writes it with "
                                f"--results docs/results (see docs/results/README.md)")
    return found[-1]


def fixture_of(record: dict) -> str:
    """The fixture a profile or benchmark measured (results written before fixtures had names: tiny-qwen)."""
    model = (record.get("workload") or {}).get("model") or {}
    return record.get("fixture") or model.get("fixture") or "tiny-qwen"


def same_machine(profile_path: Path, pattern: str, results: Path = RESULTS) -> Path:
    """The newest ``pattern`` file measured on the profile's machine kind (CPU model and core count) and fixture:
    costs measured on one CPU say nothing of a benchmark run on another (an AMX Xeon decodes the fixture about
    1.6x slower than an AVX512-BF16 EPYC in the committed runs), nor the costs of one model of another's."""
    def kind(path: Path) -> tuple:
        record = json.loads(path.read_text())
        m = record.get("machine") or {}
        return m.get("cpu_model"), m.get("cpus"), fixture_of(record)

    want = kind(profile_path)
    # newest by when it was measured (the record's date), not by name: two runs of one day differ in name only
    found = sorted((p for p in results.glob(pattern) if kind(p) == want),
                   key=lambda p: (json.loads(p.read_text()).get("date") or "", p.name))
    if not found:
        raise FileNotFoundError(f"no {results.name}/{pattern} measured on {want} (the machine of {profile_path.name}): "
                                "run bench.cpu_profile and the benchmark on one machine kind, with --results")
    return found[-1]


def prompt_tokens(data_dir: Optional[Path] = None, fixture: str = "tiny-qwen") -> float:
    """Median prompt length of the CPU recipes' toy math rows, with the fixture's tokenizer and chat template."""
    import pandas as pd
    from transformers import AutoTokenizer

    from verl_laminar.fixtures import model_dir

    data_dir = data_dir or REPO / "verl_laminar" / "data" / "toy_math"
    tok = AutoTokenizer.from_pretrained(str(model_dir(name=fixture)))
    rows = pd.read_parquet(data_dir / "train.parquet")["prompt"].head(64)
    texts = [tok.apply_chat_template(list(m), add_generation_prompt=True, tokenize=False) for m in rows]
    lens = [len(tok(t)["input_ids"]) for t in texts]
    return float(statistics.median(lens))


def e2e_params(profile: CpuProfile, e2e: dict, prompt: float, repack_pause_s: float = DEFAULT_REPACK_PAUSE_S) -> SimParams:
    """The e2e benchmark's workload on the measured machine."""
    w, lengths = e2e["workload"], e2e["workload"]["lengths"]
    steps = int(w["steps"])
    task = Task("cpu_e2e", prompt_median=prompt, prompt_sigma=0.05, prompt_max=int(prompt * 2),
                response_median=float(lengths["median"]), response_sigma=0.0, response_max=int(lengths["cap"]),
                response_lengths=skewed_lengths(lengths))
    lam = (e2e.get("runs", {}).get("laminar") or {}).get("placement") or {}
    ahead = int(lam.get("num_warmup_batches", LAMINAR_AHEAD_BATCHES))
    sched = Schedule(prompts_per_step=int(w["prompts_per_step"]), group_size=int(w["responses_per_prompt"]),
                     minibatches=1, async_buffer_steps=float(ahead - 1), groups_per_batch=laminar_groups_per_batch(lam),
                     repack_interval_s=E2E_REPACK_INTERVAL_S, repack_pause_s=repack_pause_s,
                     sync_steps=steps, pipeline_steps=steps, pipeline_warmup=1, async_steps=steps, async_warmup=1)
    # KV, batch cap and C_max are the engine's (the profile's); the event grid is finer than the GPU's
    inf = Inference(event_quantum_tokens=1.0)
    return SimParams(inference=inf, schedule=sched, tasks=(task,), cpu=padded(profile, e2e, prompt))


def batch_padded_len(lengths: Empirical, prompt: float, seqs: int, draws: int = PADDED_LEN_DRAWS) -> int:
    """The length verl's trainer computes every sequence of a step at on CPU: the prompt plus the batch's longest
    response (its agent loop pads to the configured maxima, and the batch reaches the trainer trimmed to its own
    longest: a run's update time follows each step's ``response_length/max``), averaged over seeded batches."""
    longest = lengths.sample(np.random.default_rng(0), (draws, seqs)).max(axis=1)
    return int(round(prompt + float(longest.mean())))


def padded(profile: CpuProfile, e2e: dict, prompt: float) -> CpuProfile:
    """The profile as verl's CPU trainer spends it on this benchmark: every sequence at its batch's padded length."""
    w = e2e["workload"]
    seqs = int(w["prompts_per_step"]) * int(w["responses_per_prompt"])
    return dataclasses.replace(profile, padded_len=batch_padded_len(skewed_lengths(w["lengths"]), prompt, seqs))


def laminar_groups_per_batch(placement: dict) -> Optional[int]:
    """The benchmark's ``--laminar-set laminar.dispatch.groups_per_batch=N`` (its placement records the overrides),
    or None for the product's default."""
    for kv in placement.get("laminar_overrides") or []:
        key, _, value = kv.partition("=")
        if key.strip().lstrip("+") == GROUPS_PER_BATCH_KEY and value.strip() not in ("", "null"):
            return int(value)
    return None


def skewed_lengths(lengths: dict, prompts: int = 2048) -> Empirical:
    """The benchmark's length distribution as its agent loop draws it (``policy.lengths.SkewedLengths``, the
    min / cap clamps included), as measured lengths for the simulator to resample."""
    skew = SkewedLengths(max_tokens=int(lengths["cap"]), median=int(lengths["median"]),
                         p99_ratio=float(lengths.get("p99_ratio", 10.0)), min_tokens=int(lengths.get("min_tokens", 16)),
                         seed=int(lengths.get("seed", 20261130)))
    return Empirical.of([skew.length(i, j) for i in range(prompts) for j in range(4)], source=f"SkewedLengths{lengths}")


def e2e_layout(placement: dict) -> Layout:
    ranks, replicas = int(placement["trainer_ranks"]), int(placement["rollout_replicas"])
    if placement.get("colocated"):
        return Layout(gpus=ranks, trainer_gpus=ranks, tp=1, gpus_per_machine=ranks, colocated=True)
    return Layout(gpus=ranks + replicas, trainer_gpus=ranks, tp=1, gpus_per_machine=ranks + replicas)


def predict_e2e(profile: CpuProfile, e2e: dict, prompt: float, seeds: range) -> dict:
    p = e2e_params(profile, e2e, prompt)
    out = {}
    for mode, system in E2E_SYSTEMS.items():
        lay = e2e_layout(e2e["runs"][mode]["placement"])
        runs = [simulate(system, Setup("cpu-fixture", "cpu_e2e", lay, seed, p)) for seed in seeds]
        out[mode] = {"system": system, "tokens_per_s": statistics.fmean(r.throughput for r in runs),
                     "step_s": statistics.fmean(r.step_time for r in runs),
                     "gen_fraction": _mean_or_none([r.gen_fraction for r in runs]),
                     "trainer_idle_frac": _mean_or_none([r.trainer_idle_frac for r in runs])}
    return out


def component_check(profile: CpuProfile, e2e: dict, mode: str) -> dict:
    """Each mode's measured per-step trainer components beside what the (padded) profile charges for them.

    Not a prediction of the run (the measured tokens per step are used): it says which priced component
    is off when a ratio is. The profile's numbers are solo (no co-run slowdown); the measured ones are what
    the run saw, sharing the cores as it did.
    """
    run = e2e["runs"][mode]
    lo, hi = run["window_steps"]
    tokens = float(run["trained_tokens"]) / max(1, hi - lo + 1)
    ranks = int(run["placement"]["trainer_ranks"])
    w = e2e["workload"]
    seqs = int(w["prompts_per_step"]) * int(w["responses_per_prompt"])
    m = run.get("mean_per_step_s", {})
    out = {"tokens_per_step": round(tokens, 1), "trainer_ranks": ranks,
           "update_s": {"measured": m.get("timing_s/update_actor"),
                        "profile_solo": round(profile.train_seconds(tokens, ranks, seqs=seqs), 3)}}
    if m.get("timing_s/old_log_prob", 0.0) > 0.1:
        out["old_log_prob_s"] = {"measured": m["timing_s/old_log_prob"],
                                 "profile_solo": round(profile.train_seconds(tokens, ranks, True, seqs)
                                                       - profile.train_seconds(tokens, ranks, seqs=seqs), 3)}
    if "timing_s/update_weights" in m:
        out["update_weights_s"] = {"measured": m["timing_s/update_weights"], "profile_solo": profile.weight_load_s}
    if mode == "laminar":
        out["rollout_wait_for_weights_s_per_step"] = {"measured": m.get(lm.ROLLOUT_WAIT),
                                                      "profile_solo_per_refresh": round(profile.weight_load_s
                                                                                        + profile.publish_s, 3)}
    return out


def _mean_or_none(xs: list) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return round(statistics.fmean(xs), 3) if xs else None


def dedicated(profile: CpuProfile) -> CpuProfile:
    """The same solo costs with no co-run slowdown: every process on cores of its own."""
    return dataclasses.replace(profile, decode_slowdown=tuple((k, 1.0) for k, _ in profile.decode_slowdown),
                               train_slowdown=tuple((k, 1.0) for k, _ in profile.train_slowdown))


RATIOS = (("laminar_vs_sync", "speedup", "sync"), ("laminar_vs_sync_bypass", "speedup_vs_sync_bypass", "sync_bypass"),
          ("laminar_vs_separate_async", "speedup_vs_separate_async", "separate_async"))


def validate(results: Path = RESULTS, seeds: range = range(16), prompt: Optional[float] = None) -> dict:
    prof_path = newest("cpu_profile_*.json", results)
    e2e_path = same_machine(prof_path, E2E_PATTERN, results)
    relay_path = next(iter(sorted(results.glob("bench_relay_sweep_*.json"))[-1:]), None)
    profile = load_profile(prof_path, relay_path)
    e2e = json.loads(e2e_path.read_text())
    vocab = ((e2e.get("workload") or {}).get("model") or {}).get("vocab_size")
    if vocab and not (json.loads(prof_path.read_text()).get("model") or {}).get("vocab_size"):
        # a profile that did not record its model: the paired benchmark ran the same fixture and did
        profile = dataclasses.replace(profile, vocab=int(vocab))
    fixture = fixture_of(json.loads(prof_path.read_text()))
    prompt = prompt if prompt is not None else prompt_tokens(fixture=fixture)
    pred = predict_e2e(profile, e2e, prompt, seeds)
    alone = predict_e2e(dedicated(profile), e2e, prompt, seeds)
    repack = validate_repack(profile, results, seeds)
    if repack is None:
        logger.warning("no %s/bench_repack_*.json: the repack gain is not validated", results.name)
    rows = {}
    for name, key, base in RATIOS:
        predicted = pred["laminar"]["tokens_per_s"] / pred[base]["tokens_per_s"]
        measured = float(e2e[key])
        rows[name] = {"predicted": round(predicted, 3), "measured": round(measured, 3),
                      "error": round(predicted / measured - 1.0, 3),
                      "within": abs(predicted / measured - 1.0) <= TOLERANCE,
                      "dedicated_cores": round(alone["laminar"]["tokens_per_s"] / alone[base]["tokens_per_s"], 3)}
    measured_modes = {m: {"tokens_per_s": round(float(e2e["tokens_per_s"][m]), 2),
                          "generation_share": e2e.get("generation_share", {}).get(m)} for m in E2E_SYSTEMS}
    trained = padded(profile, e2e, prompt)  # once: the padded length is the same for every mode
    components = {m: component_check(trained, e2e, m) for m in E2E_SYSTEMS}
    return {
        "what": "SIMULATED predictions beside MEASURED values",
        "inputs": {"cpu_profile": _rel(prof_path), "e2e": _rel(e2e_path), "relay": _rel(relay_path) if relay_path else None,
                   "fixture": fixture, "seeds": [seeds.start, seeds.stop], "prompt_tokens": prompt},
        "profile": {"decode_step": dataclasses.asdict(profile.decode), "prefill_s_per_token": profile.prefill_s_per_token,
                    "weight_load_s": profile.weight_load_s, "publish_s": profile.publish_s,
                    "train_s_per_token": dict(profile.train_s_per_token),
                    "forward_s_per_token": dict(profile.forward_s_per_token),
                    "decode_slowdown": {f"{e}e+{t}t": f for (e, t), f in profile.decode_slowdown},
                    "train_slowdown": {f"{e}e+{t}t": f for (e, t), f in profile.train_slowdown}},
        "ratios": rows,
        "predicted_modes": {m: {k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items()}
                            for m, d in pred.items()},
        "measured_modes": measured_modes,
        "dedicated_cores_modes": {m: round(d["tokens_per_s"], 2) for m, d in alone.items()},
        "components": components,
        "repack": repack,
        "all_within": all(r["within"] for r in rows.values()) and repack is not None and repack["within"],
    }


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return p.name


# -- the repack gain ------------------------------------------------------------------------------------
FP32_BYTES_PER_PARAM = 4  # bench.repack runs vLLM-CPU in float32 (its --dtype default)


def repack_params(profile: CpuProfile, rep: dict, prompts: int = 4096) -> SimParams:
    """``bench.repack``'s workload and engines on the measured machine.

    Its own decode profile (``decode_step_ms``, measured on replica 0 with the run's engine settings before
    the timed runs) prices a decode step; its 4 MiB float32 KV cache sets the capacity; the measured repack
    duration sets the pause; the co-run slowdowns and the weight load (scaled to float32 bytes) come from
    the cpu profile. Its stand-in trainer publishes every ``publish_every`` finished groups at no cost.
    """
    w = rep["workload"]
    step = {int(b): ms / 1000.0 for b, ms in rep["decode_step_ms"].items()}
    decode = fit_decode({"0": {str(b): s for b, s in step.items()}})
    kv_per_token = 2 * profile.model.layers * profile.model.kv_heads * profile.model.head_dim * FP32_BYTES_PER_PARAM
    cpu = dataclasses.replace(
        profile, decode=decode, kv_capacity=int(w["kv_mb"]) * (1 << 20) // kv_per_token, max_seqs=64,
        repack_batch=int(rep["B"]), weight_load_s=profile.weight_load_s * 2, publish_s=0.0,
        train_s_per_token=((1, 0.0),), forward_s_per_token=((1, 0.0),))
    skew = SkewedLengths(max_tokens=int(w["max_tokens"]), median=int(w["median"]), seed=int(w.get("seed", 0)))
    resp = Empirical.of([skew.length(i, j) for i in range(prompts) for j in range(int(w["n"]))], "bench.repack lengths")
    task = Task("cpu_repack", prompt_median=24, prompt_sigma=0.2, prompt_max=32,  # randint(16, 32) prompt tokens
                response_median=float(w["median"]), response_sigma=0.0, response_max=int(w["max_tokens"]),
                response_lengths=resp)
    groups, every = int(w["groups"]), int(w["publish_every"])
    sched = Schedule(prompts_per_step=every, group_size=int(w["n"]), minibatches=1, async_buffer_steps=float(groups),
                     async_steps=groups // every, async_warmup=0, repack_interval_s=float(w["interval"]),
                     repack_pause_s=float(rep.get("repack_s_mean") or DEFAULT_REPACK_PAUSE_S))
    return SimParams(inference=Inference(event_quantum_tokens=1.0, max_num_seqs=64, c_max=float(w["c_max"])),
                     schedule=sched, tasks=(task,), cpu=cpu)


def predict_repack(profile: CpuProfile, rep: dict, seeds: range) -> dict:
    from verl_laminar.sim.systems.laminar import Laminar

    w = rep["workload"]
    total = int(w["groups"])

    class Finite(Laminar):
        """The benchmark dispatches a fixed set of groups; the tail at the end is part of what it measures."""

        def next_groups(self, n):
            return super().next_groups(max(0, min(n, total - self._next_gid)))

    p = repack_params(profile, rep)
    lay = Layout(gpus=int(w["replicas"]) + 1, trainer_gpus=1, tp=1, gpus_per_machine=int(w["replicas"]) + 1)
    rates = {True: [], False: []}
    for seed in seeds:
        for on in (True, False):
            sim = Finite(Setup("cpu-fixture", "cpu_repack", lay, seed, p), repack=on, relays=True)
            sim.run()
            fin = sim.meter.finished
            rates[on].append(sum(g for _, g, _ in fin) / max(t for t, _, _ in fin))
    on, off = statistics.fmean(rates[True]), statistics.fmean(rates[False])
    return {"gen_tokens_per_s_on": round(on, 2), "gen_tokens_per_s_off": round(off, 2), "gain": round(on / off, 3)}


def validate_repack(profile: CpuProfile, results: Path, seeds: range) -> Optional[dict]:
    found = sorted(results.glob("bench_repack_2*.json"))
    if not found:
        return None
    rep = json.loads(found[-1].read_text())
    pred = predict_repack(profile, rep, seeds)
    measured = float(rep["gain"])
    return {"file": _rel(found[-1]), "predicted": pred["gain"], "measured": round(measured, 3),
            "error": round(pred["gain"] - measured, 3), "within": abs(pred["gain"] - measured) <= REPACK_TOLERANCE,
            "predicted_rates": pred,
            "measured_rates": {"on": round(float(rep["gen_tokens_per_s_on"]), 2),
                               "off": round(float(rep["gen_tokens_per_s_off"]), 2)}}
