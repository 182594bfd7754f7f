"""A user's own workload (``sim.lengths``): lengths as MEDIAN,P99 or a file, batch, group size, updates.

What is checked: the default path is untouched (bit for bit), each file format reads, every bad input is refused
with a message naming the fix (as an argparse error on the command line), measured lengths are resampled
deterministically and shared by every system, and the systems respond to a heavier tail as the paper argues.
"""

import dataclasses as dc
import json
import pickle

import numpy as np
import pytest

from verl_laminar.sim.__main__ import main
from verl_laminar.sim.lengths import (
    Z_99,
    Empirical,
    LengthsError,
    LogNormal,
    WorkloadSpec,
    apply_workload,
    load_lengths,
    parse_lengths,
)
from verl_laminar.sim.params import DEFAULT_PARAMS as P
from verl_laminar.sim.params import MATH, P99_OVER_MEDIAN_SIGMA
from verl_laminar.sim.search import best_split
from verl_laminar.sim.workload import _CHUNK, SimWorkload

# small steps keep each simulation well under a second (as tests/sim/test_systems_on_cpu.py)
SMALL = dc.replace(P, schedule=dc.replace(P.schedule, sync_steps=2, pipeline_steps=4, pipeline_warmup=1,
                                          async_steps=5, async_warmup=1))


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- the default path does not move ----------------------------------------------------------------------------


def test_paper_default_as_median_p99_is_the_default_params_exactly():
    assert LogNormal(1400, 14000).sigma == P99_OVER_MEDIAN_SIGMA
    p = apply_workload(P, WorkloadSpec(responses=LogNormal(1400, 14000), batch=512, group_size=16, updates=16))
    assert p == P and hash(p) == hash(P)
    assert apply_workload(P, WorkloadSpec()) is P


def test_lognormal_draw_is_the_original_expression_value_for_value():
    # the expression workload.py had before measured lengths existed, for block 0 of seed 7
    t, g = MATH, 16
    rng = np.random.default_rng([7, 0])
    prompt = np.minimum(t.prompt_max, np.maximum(
        1.0, np.round(rng.lognormal(np.log(t.prompt_median), t.prompt_sigma, _CHUNK))))
    resp = np.minimum(t.response_max, np.maximum(
        1.0, np.round(rng.lognormal(np.log(t.response_median), t.response_sigma, (_CHUNK, g)))))
    got_prompt, got_resp, tools = SimWorkload(t, 7, g)._block(0)
    assert got_prompt == prompt.tolist() and got_resp == resp.tolist() and tools is None


def test_median_and_p99_are_what_the_draws_show():
    spec = WorkloadSpec(responses=LogNormal(500, 8000), prompts=LogNormal(300, 1200))
    task = apply_workload(P, spec).task("math")
    wl = SimWorkload(task, 0, 16)
    groups = [wl.group(i, i * 16) for i in range(2048)]
    resp = np.array([s.gen_tokens for g in groups for s in g.seqs])
    prompt = np.array([g.seqs[0].ctx for g in groups])
    assert np.median(resp) == pytest.approx(500, rel=0.03)
    assert np.quantile(resp, 0.99) == pytest.approx(8000, rel=0.06)
    assert np.median(prompt) == pytest.approx(300, rel=0.05)
    assert np.quantile(prompt, 0.99) == pytest.approx(1200, rel=0.1)
    assert task.response_max == MATH.response_max and resp.max() <= MATH.response_max


def test_sigma_is_log_ratio_over_z99():
    for med, p99 in ((100, 100), (1000, 5000), (1400, 14000), (700, 16000)):
        assert LogNormal(med, p99).sigma == pytest.approx(np.log(p99 / med) / Z_99)
        assert np.exp(LogNormal(med, p99).sigma * Z_99) * med == pytest.approx(p99)


# -- files -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,text", [
    ("l.txt", "# measured\n100\n\n200  # a comment\n300\n"),
    ("l.json", "[100, 200, 300]"),
    ("l.jsonl", '{"response_length": 100}\n{"response_length": 200, "score": 1}\n\n{"response_length": 300}\n'),
    ("ids.jsonl", '{"response": [1,2,3,4]}\n'.replace("[1,2,3,4]", json.dumps(list(range(100)))) +
     json.dumps({"response": list(range(200))}) + "\n" + json.dumps({"response": list(range(300))}) + "\n"),
    ("records.json", json.dumps([{"response_length": 100}, {"response_length": 200}, {"response_length": 300}])),
    ("noext", "300\n100\n200\n"),  # recognised by content, not by name
])
def test_every_format_reads_the_same_lengths(tmp_path, name, text):
    e = load_lengths(write(tmp_path, name, text))
    assert sorted(e.values.tolist()) == [100.0, 200.0, 300.0]
    assert (e.count, e.median, e.max) == (3, 200.0, 300)


def test_prompt_lengths_read_the_prompt_fields(tmp_path):
    path = write(tmp_path, "dump.jsonl", json.dumps({"prompt_length": 40, "response_length": 900}) + "\n" +
                 json.dumps({"prompt": list(range(60)), "response_length": 100}) + "\n")
    assert sorted(load_lengths(path, "prompt").values.tolist()) == [40.0, 60.0]
    assert sorted(load_lengths(path, "response").values.tolist()) == [100.0, 900.0]


@pytest.mark.parametrize("name,text,message", [
    ("empty.txt", "", "empty"),
    ("blank.txt", "\n# nothing\n\n", "no lengths"),
    ("neg.txt", "10\n-5\n", "token counts >= 0"),
    ("neg.json", "[10, -5]", "token counts >= 0"),
    ("frac.txt", "10\n12.5\n", "line 2"),
    ("word.json", '[10, "x"]', "not an integer"),
    ("verl_dump.jsonl", '{"input": "What is 2+2?", "output": "4", "score": 1.0, "step": 3}\n', "tokenizer"),
    ("text.jsonl", '{"response": "some text"}\n', "tokenizer"),
    ("other.jsonl", '{"length": 5}\n', "response_length"),
    ("bad.jsonl", '{"response_length": 5}\n{oops\n', "line 2"),
    ("obj.json", "[1, 2", "not valid JSON"),
])
def test_bad_files_are_refused_with_the_fix(tmp_path, name, text, message):
    with pytest.raises(LengthsError, match=message):
        load_lengths(write(tmp_path, name, text))


def test_a_missing_file_or_nonsense_is_refused():
    with pytest.raises(LengthsError, match="MEDIAN,P99"):
        parse_lengths("no/such/file.txt")
    with pytest.raises(LengthsError, match="MEDIAN,P99"):
        parse_lengths("1400,lots")


@pytest.mark.parametrize("text,message", [
    ("1400,700", "cannot be below the median"),
    ("0,100", "median"),
    ("-5,100", "median"),
    ("1000,9000,8000", "cut the stated tail"),
    ("1000,9000,8000.5", "integer"),
])
def test_bad_median_p99_are_refused(text, message):
    with pytest.raises(LengthsError, match=message):
        parse_lengths(text)


def test_a_p99_above_the_tasks_cap_needs_an_explicit_max():
    with pytest.raises(LengthsError, match="MEDIAN,P99,MAX"):
        apply_workload(P, WorkloadSpec(responses=LogNormal(4000, 40000)))
    p = apply_workload(P, WorkloadSpec(responses=parse_lengths("4000,40000,65536")))
    assert p.task("math").response_max == 65536 and p.task("tool").response_max == 65536


def test_batch_must_split_into_whole_updates():
    with pytest.raises(LengthsError, match="multiple of updates"):
        apply_workload(P, WorkloadSpec(batch=100, updates=16))
    p = apply_workload(P, WorkloadSpec(batch=96, group_size=8, updates=12))
    assert (p.schedule.prompts_per_step, p.schedule.group_size, p.schedule.minibatches) == (96, 8, 12)
    assert p.tasks == P.tasks  # lengths untouched


# -- resampling ------------------------------------------------------------------------------------------------


def test_measured_lengths_are_resampled_deterministically_under_the_seed():
    measured = [7, 50, 50, 400, 3000, 12000]
    e = Empirical.of(measured, "m")
    task = apply_workload(P, WorkloadSpec(responses=e)).task("math")
    assert task.response_lengths == e and task.response_max == 12000

    def draws(seed):
        wl = SimWorkload(task, seed, 16)
        return [s.gen_tokens for i in range(600) for s in wl.group(i, i * 16).seqs]  # crosses a block boundary

    a, b, c = draws(3), draws(3), draws(4)
    assert a == b and a != c
    assert set(a) <= set(map(float, measured))
    counts = {v: a.count(float(v)) / len(a) for v in set(measured)}
    assert counts[50] == pytest.approx(2 / 6, abs=0.02) and counts[12000] == pytest.approx(1 / 6, abs=0.02)


def test_a_zero_length_is_generated_as_one_token():
    task = apply_workload(P, WorkloadSpec(responses=Empirical.of([0, 0], "zeros"))).task("math")
    assert {s.gen_tokens for s in SimWorkload(task, 0, 4).group(0, 0).seqs} == {1.0}


def test_measured_lengths_hash_by_digest_pickle_and_stay_out_of_asdict():
    e1, e2, e3 = Empirical.of([1, 2, 3], "a"), Empirical.of([1, 2, 3], "a"), Empirical.of([1, 2, 4], "a")
    assert e1 == e2 and hash(e1) == hash(e2) and e1 != e3
    back = pickle.loads(pickle.dumps(e1))  # the grid's process pool pickles its jobs' params
    assert back == e1 and back.values.tolist() == [1.0, 2.0, 3.0]
    p = apply_workload(P, WorkloadSpec(responses=e1))
    d = dc.asdict(p)["tasks"][0]["response_lengths"]
    assert d["count"] == 3 and "values" not in d and "_values" not in d
    json.dumps(dc.asdict(p))  # a result JSON can carry these params


def test_every_system_sees_the_same_measured_stream():
    """Paired comparison: a system's workload is a function of (task, seed) only."""
    from verl_laminar.sim.systems import Setup, default_layout
    from verl_laminar.sim.systems.laminar import Laminar
    from verl_laminar.sim.systems.synchronous import batch_profile

    p = apply_workload(SMALL, WorkloadSpec(responses=Empirical.of(list(range(100, 5000, 7)), "m"), batch=16,
                                           updates=4))
    fresh = SimWorkload(p.task("math"), 5, p.schedule.group_size)
    expected = [fresh.group(i, i * 16) for i in range(32)]
    # Laminar and AReaL take groups through Base.next_groups; sync and one-step through batch_profile
    lam = Laminar(Setup("7b", "math", default_layout("7b", 16, 8, p), 5, p)).next_groups(32)
    assert [[s.tokens for s in g.seqs] for g in lam] == [[s.tokens for s in g.seqs] for g in expected]
    prof = batch_profile("7b", "math", 5, p, 1, 8, 1)  # the second step's 16 groups
    assert prof.group_tokens == tuple(g.tokens for g in expected[16:32])


# -- the command line ------------------------------------------------------------------------------------------


def single(*extra):
    return ["--model", "7b", "--gpus", "16", "--system", "laminar", "--json", *extra]


def test_cli_runs_a_measured_workload(tmp_path, capsys):
    path = write(tmp_path, "lengths.txt", "\n".join(str(x) for x in range(200, 4000, 13)))
    assert main(single("--lengths", path, "--prompt-lengths", "200,800", "--batch", "32", "--group-size", "8",
                       "--updates", "4")) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["label"] == "SIMULATED" and out["throughput"] > 0
    w = out["workload"]
    assert w["responses"]["kind"] == "empirical" and w["responses"]["count"] == len(range(200, 4000, 13))
    assert w["prompts"] == {"kind": "lognormal", "median": 200.0, "p99": 800.0, "max": None,
                            "sigma": pytest.approx(np.log(4) / Z_99, abs=1e-6)}
    assert (w["batch"], w["group_size"], w["updates"]) == (32, 8, 4)


@pytest.mark.parametrize("extra,message", [
    (["--lengths", "1400,700"], "cannot be below the median"),
    (["--lengths", "EMPTY"], "empty"),
    (["--lengths", "NEG"], ">= 0"),
    (["--prompt-lengths", "100,50"], "cannot be below the median"),
    (["--batch", "0"], "must be >= 1"),
    (["--updates", "-2"], "must be >= 1"),
    (["--batch", "30", "--updates", "4"], "multiple of updates"),
    (["--lengths", "4000,40000"], "MEDIAN,P99,MAX"),
])
def test_cli_refuses_bad_workloads_with_an_argparse_error(tmp_path, capsys, extra, message):
    files = {"EMPTY": write(tmp_path, "empty.txt", ""), "NEG": write(tmp_path, "neg.txt", "5\n-1\n")}
    with pytest.raises(SystemExit) as exc:
        main(single(*[files.get(x, x) for x in extra]))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "usage:" in err


def test_the_paper_grid_keeps_the_papers_workload(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--paper", "--lengths", "1000,5000"])
    assert exc.value.code == 2 and "not to --paper" in capsys.readouterr().err


# -- mechanisms: the paper's argument, in the simulator --------------------------------------------------------


def _tput(system, p, seed=0):
    return best_split(system, "7b", "math", 16, seed, p).best.throughput


@pytest.mark.parametrize("seed", [0, 1])
def test_a_heavier_tail_costs_sync_more_than_laminar(seed):
    """Paper, Context: a global update waits for the longest trajectory, so at a fixed median a heavier tail
    (p99 = 10x the median, the paper's, against 2x) idles a synchronous step more; Laminar's rollouts refresh one
    by one and do not wait for it. (Between two heavy tails the difference can vanish: once a step's longest
    trajectory reaches the length cap, a heavier tail adds tokens without lengthening the synchronous step.)"""
    runs = {}
    for p99 in (2000, 10000):
        p = apply_workload(SMALL, WorkloadSpec(responses=LogNormal(1000, p99), batch=32, updates=4))
        runs[p99] = {s: _tput(s, p, seed) for s in ("sync", "laminar")}
    sync_kept = runs[10000]["sync"] / runs[2000]["sync"]
    laminar_kept = runs[10000]["laminar"] / runs[2000]["laminar"]
    assert sync_kept < 1 and sync_kept < laminar_kept - 0.2  # ~0.32 against >= 0.72 on this cell
    assert runs[10000]["laminar"] / runs[10000]["sync"] > 2 * runs[2000]["laminar"] / runs[2000]["sync"]


def test_a_skewed_measured_file_costs_sync_more_than_laminar():
    """The same through ``--lengths FILE``: 95% short answers and 5% long ones against the same mean, even."""
    mean = int(0.95 * 600 + 0.05 * 12000)
    skewed = Empirical.of([600] * 95 + [12000] * 5, "skewed")
    even = Empirical.of([mean] * 100, "even")
    runs = {}
    for name, e in (("skewed", skewed), ("even", even)):
        p = apply_workload(SMALL, WorkloadSpec(responses=e, batch=32, updates=4))
        runs[name] = {s: _tput(s, p) for s in ("sync", "laminar")}
    assert runs["skewed"]["sync"] < runs["even"]["sync"]
    assert runs["skewed"]["sync"] / runs["even"]["sync"] < runs["skewed"]["laminar"] / runs["even"]["laminar"]


def test_the_tool_task_takes_measured_lengths_too():
    from verl_laminar.sim.systems import Setup, default_layout, simulate

    p = apply_workload(SMALL, WorkloadSpec(responses=Empirical.of(list(range(300, 3000, 9)), "m"), batch=16,
                                           updates=4))
    res = simulate("laminar", Setup("7b", "tool", default_layout("7b", 16, 8, p), 0, p))
    assert res.throughput > 0 and res.task == "tool"
