"""Metric names live in one module under laminar/, and a snapshot flattens to what verl's tracker logs."""

import ast
from pathlib import Path

import pytest

from verl_laminar import metrics as m
from verl_laminar.policy.accounting import AccountingSnapshot
from verl_laminar.policy.staleness import summarize

PACKAGE = Path(m.__file__).parent


def snapshot(**kw):
    base = dict(step=3, staleness=summarize([0, 0, 1, 3]), staleness_max_all=4, tokens_per_s=120.5, step_tokens=482,
                publish_interval_s=4.0, trainer_wait_s=0.25, rollout_wait_s=1.5, replica_versions={0: 3, 1: 1},
                counts={"in_flight": 8, "finished": 2, "trained": 40, "discarded": 1})
    base.update(kw)
    return AccountingSnapshot(**base)


def test_snapshot_flattens_to_floats_under_the_prefix():
    out = m.snapshot_to_metrics(snapshot())
    m.check_names(out)
    assert all(type(v) is float for v in out.values())
    expected = {
        "laminar/staleness/mean": 1.0, "laminar/staleness/max": 3.0, "laminar/staleness/max_all": 4.0,
        "laminar/staleness/hist_0": 2.0, "laminar/staleness/hist_1": 1.0, "laminar/staleness/hist_2": 0.0,
        "laminar/staleness/hist_3": 1.0, "laminar/throughput_tokens_per_s": 120.5,
        "laminar/trainer/wait_for_data_s": 0.25, "laminar/rollout/wait_for_weights_s": 1.5,
        "laminar/replica/0/version": 3.0, "laminar/replica/1/version": 1.0, "laminar/replica/version_spread": 2.0,
        "laminar/trajectories/trained": 40.0, "laminar/publish_interval_s": 4.0, "laminar/step_tokens": 482.0,
    }
    assert {k: out[k] for k in expected} == expected


def test_missing_values_are_left_out_not_zeroed():
    out = m.snapshot_to_metrics(snapshot(tokens_per_s=None, publish_interval_s=None, replica_versions={},
                                         staleness=summarize([])))
    assert m.THROUGHPUT not in out and m.PUBLISH_INTERVAL not in out and m.REPLICA_VERSION_SPREAD not in out
    assert not any(k.startswith(m.STALENESS_HIST_PREFIX) for k in out)


def test_staleness_histogram_off_leaves_out_the_bins_and_keeps_the_other_staleness_metrics():
    """laminar.metrics.staleness_histogram=false: no laminar/staleness/hist_<k>; mean, quantiles, max, count stay."""
    on, off = m.snapshot_to_metrics(snapshot()), m.snapshot_to_metrics(snapshot(), histogram=False)
    bins = {k for k in on if k.startswith(m.STALENESS_HIST_PREFIX)}
    assert bins == {m.staleness_hist(k) for k in range(4)}
    assert set(on) - set(off) == bins
    assert {k: on[k] for k in off} == off
    assert {m.STALENESS_MEAN, m.STALENESS_P50, m.STALENESS_P90, m.STALENESS_MAX, m.STALENESS_COUNT} <= set(off)


def test_the_trainer_passes_laminar_metrics_staleness_histogram():
    """LaminarTrainer._compute_metrics flattens its snapshot with the key's value (read here from its source: the
    trainer module imports verl and Ray)."""
    tree = ast.parse((PACKAGE / "trainer" / "laminar_trainer.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "lm.snapshot_to_metrics"]
    assert [[ast.unparse(k.value) for k in c.keywords if k.arg == "histogram"] for c in calls] == [
        ["self.laminar.metrics.staleness_histogram"]]


def test_unknown_ledger_count_names_the_fix():
    with pytest.raises(KeyError, match="_COUNT_NAMES"):
        m.snapshot_to_metrics(snapshot(counts={"regenerated": 1}))


@pytest.mark.parametrize(
    "bad,error,match",
    [({"loss": 1.0}, ValueError, "outside 'laminar/'"), ({"laminar/x": "1"}, TypeError, "log a float"),
     ({"laminar/x": True}, TypeError, "bool")],
)
def test_check_names_rejects(bad, error, match):
    with pytest.raises(error, match=match):
        m.check_names(bad)


def test_repack_and_buffer_metrics():
    out = m.repack_metrics(migrations=5, emptied=2, seconds=0.7, kv_use_before=0.6, kv_use_after=None)
    assert out == {"laminar/repack/migrations": 5.0, "laminar/repack/emptied": 2.0, "laminar/repack/seconds": 0.7,
                   "laminar/repack/kv_use_before": 0.6}
    assert m.buffer_metrics(3, 1, 0, 2)["laminar/buffer/discarded_groups"] == 2.0
    with pytest.raises(ValueError, match="bin -1"):
        m.staleness_hist(-1)


def test_every_constant_is_under_the_prefix_and_unique():
    names = [v for k, v in vars(m).items() if k.isupper() and isinstance(v, str) and k != "PREFIX"]
    assert names and all(n.startswith(m.PREFIX) for n in names)
    assert len(names) == len(set(names))


def test_no_module_spells_a_laminar_metric_outside_metrics_py():
    """Metric names live in verl_laminar/metrics.py; other modules import the constants."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "metrics.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("laminar/"):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}: {node.value}")
    # the relay backend predates this module; its two names are defined here and must keep matching
    backend = "verl_laminar/relay/verl_backend.py"
    allowed = {f"{backend}: {m.RELAY_PUBLISH_S}", f"{backend}: {m.RELAY_VERSION}"}
    assert set(offenders) <= allowed, sorted(set(offenders) - allowed)
