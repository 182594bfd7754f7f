"""The repack monitor's parser of vLLM's Prometheus text (captured shape of vLLM 0.31's /metrics)."""

import pytest

from verl_laminar.rollout.vllm_metrics import MetricsError, parse

TEXT = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="512",prefix_caching="True"} 1.0
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 1234.0
"""


def test_reading_has_kv_use_counts_and_capacity():
    r = parse(TEXT)
    assert (r.kv_used, r.running, r.waiting, r.kv_capacity_tokens) == (0.25, 3, 1, 512 * 16)
    assert r.kv_tokens == 2048


def test_stats_off_is_named_with_the_fix():
    with pytest.raises(MetricsError, match="disable_log_stats=false"):
        parse("vllm:prompt_tokens_total 1.0\n")
    no_info = "\n".join(line for line in TEXT.splitlines() if "cache_config_info" not in line)
    with pytest.raises(MetricsError, match="cache_config_info"):
        parse(no_info)
