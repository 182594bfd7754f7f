"""A step line that Ray's log monitor broke in two is read whole (seen in a failover e2e run)."""

from verl_laminar.report.runlog import RunRecord

A = "\x1b[36m(TaskRunnerV1 pid=600)\x1b[0m step:4 - global_seqlen/min:4030.0 - global"
B = "\x1b[36m(TaskRunnerV1 pid=600)\x1b[0m _seqlen/balanced_min:4030.0 - training/off_policy/trajectory_spans/max:1"
OTHER = "\x1b[36m(LaminarVLLMHttpServer pid=1218)\x1b[0m WARNING something - else:1"


def test_the_second_part_of_a_split_step_line_is_joined_to_the_first():
    run = RunRecord("x").feed_all([(0.0, A), (0.1, B)])
    assert run.steps[4] == {"global_seqlen/min": 4030.0, "global_seqlen/balanced_min": 4030.0,
                            "training/off_policy/trajectory_spans/max": 1.0}


def test_lines_of_another_actor_or_after_another_line_are_not_joined():
    assert RunRecord("x").feed_all([(0.0, A), (0.1, OTHER), (0.2, B)]).steps[4] == {"global_seqlen/min": 4030.0}
    assert RunRecord("x").feed_all([(0.0, A), (0.1, OTHER)]).steps[4] == {"global_seqlen/min": 4030.0}
