"""bench.learn's generated-against-trained response lengths (run.response_lengths) from a Laminar timeline, and the
step record that carries the trained trajectories' lengths."""

from __future__ import annotations

from verl_laminar import timeline as tl
from verl_laminar.bench.learn.run import response_lengths


def _write(path, records):
    path.write_text("".join(tl.to_json(r) + "\n" for r in records))


def test_trained_lengths_come_from_the_step_records_and_generated_from_the_trajectories(tmp_path):
    spans = [tl.TrajectorySpan(0, 0, 1.0, 2.0, n, 10) for n in list(range(1, 100)) + [500]]
    steps = [tl.Step(1, 3.0, 0.1, 0.2, (0, 0, 1), (1, 2, 3)), tl.Step(2, 4.0, 0.1, 0.2, (0, 1), (50, 400))]
    path = tmp_path / "laminar_timeline.jsonl"
    _write(path, spans + steps)
    out = response_lengths(path)
    assert out["generated"] == 100 and out["generated_p99"] == 99 and out["generated_max"] == 500
    assert out["trained"] == 5 and out["trained_p99"] == 400 and out["trained_max"] == 400
    assert out["trained_over_generated_p99"] == round(400 / 99, 4)


def test_a_timeline_without_lengths_in_its_steps_says_so(tmp_path):
    path = tmp_path / "laminar_timeline.jsonl"
    path.write_text(tl.to_json(tl.TrajectorySpan(0, 0, 1.0, 2.0, 7, 10)) + "\n"
                    + '{"kind":"step","step":1,"t":3.0,"wait_for_data_s":0.1,"wait_for_weights_s":0.2,'
                      '"staleness":[0]}\n')
    [step] = [r for r in tl.read_timeline(path) if isinstance(r, tl.Step)]
    assert step.response_tokens == ()  # a record from before steps carried lengths still reads
    out = response_lengths(path)
    assert out["generated"] == 1 and out["trained"] == 0 and out["trained_p99"] is None
    assert out["trained_over_generated_p99"] is None
    assert response_lengths(tmp_path / "absent.jsonl") is None
