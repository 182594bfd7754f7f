"""The test runner's interpreter shutdown, after what the suite leaves in its own process: a pytest process once
died of a segmentation fault after printing its summary (exit 139), which fails CI whatever the tests said.

What the suite builds in the runner's process and ends before the shutdown: an in-process vLLM engine
(``tests/relay/test_vllm_load_on_cpu.py``: its engine core and vLLM's gloo process groups, 39 native threads, are
released with ``laminar_testing.release_inprocess_engine``) and in-process Ray sessions (``ray.init`` /
``ray.shutdown`` in the relay and pool tests; Ray's gRPC and GCS-client threads stay to the end) and relays over
Mooncake (``tests/relay/test_transports_on_cpu.py``: each Transfer Engine runs threads of its own, which no relay
stopped before its ``close`` released the engine; they ran through the interpreter's shutdown). This test runs that
path in a fresh interpreter under ``-X faulthandler`` and checks that it exits 0, that nothing printed a fatal error,
and what still runs when the interpreter shuts down.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from laminar_testing import REPO

pytestmark = pytest.mark.e2e  # a vLLM engine and a Ray session in a fresh interpreter (~30-60 s on 2 cores)

SCRIPT = r'''
import json, os, sys, tempfile
sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
import ray, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from vllm import LLM, SamplingParams
from laminar_testing import native_threads, release_inprocess_engine

model = tempfile.mkdtemp()
cfg = Qwen2Config(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=False, torch_dtype="float32")
torch.manual_seed(0)
Qwen2ForCausalLM(cfg).eval().save_pretrained(model)
llm = LLM(model=model, skip_tokenizer_init=True, enforce_eager=True, dtype="float32", max_model_len=128,
          max_num_seqs=4, seed=0)
llm.generate([{"prompt_token_ids": [5, 17, 42]}], SamplingParams(max_tokens=4, detokenize=False))
with_engine = native_threads()
release_inprocess_engine(llm)
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
assert ray.get(ray.put(7)) == 7
ray.shutdown()
from verl_laminar.relay.mooncake import load_engine_class
from verl_laminar.relay.relay import Relay
from verl_laminar.relay.transport_spec import TransportSpec

load_engine_class()
tasks = lambda: set(os.listdir("/proc/self/task"))
base = tasks()
relay = Relay("solo", root=tempfile.mkdtemp(), transport=TransportSpec("mooncake"), io_timeout_s=5.0)
mooncake = tasks() - base  # the Transfer Engine's own threads
relay.close(destroy=True)
print("SHUTDOWN-THREADS " + json.dumps({"with_engine": sorted(set(with_engine)), "at_exit": sorted(native_threads()),
                                        "mooncake_engine": len(mooncake), "mooncake_left": len(mooncake & tasks())}))
'''


def test_the_runner_shuts_down_cleanly_after_an_inprocess_engine_and_ray():
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", SCRIPT, str(REPO)], capture_output=True,
                          text=True, timeout=600, cwd=REPO)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]  # -11 / 139 was the crash
    assert "Fatal Python error" not in out, out[-6000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("SHUTDOWN-THREADS "))
    threads = json.loads(line.split(" ", 1)[1])
    assert any(n.startswith("gloo") for n in threads["with_engine"]), threads  # the groups were there to release
    assert not [n for n in threads["at_exit"] if n.startswith(("gloo", "pt_gloo"))], threads
    # a relay's Mooncake Transfer Engine ran threads of its own, and its close ended them (relay/mooncake.py)
    assert threads["mooncake_engine"] >= 1 and threads["mooncake_left"] == 0, threads
