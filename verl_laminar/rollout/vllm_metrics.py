"""The repack monitor's reading of a verl vLLM server: KV-cache use and request counts from ``/metrics``.

verl's ``vLLMHttpServer`` has no KV-cache query, but with ``actor_rollout_ref.rollout.disable_log_stats=false``
(which ``+laminar=enabled`` sets) vLLM's OpenAI server publishes its scheduler gauges in Prometheus text on
``http://<server address>/metrics``:
    vllm:kv_cache_usage_perc   fraction of KV blocks in use (0..1)
    vllm:num_requests_running / vllm:num_requests_waiting
    vllm:cache_config_info{block_size=..., num_gpu_blocks=...}   the cache size, for tokens
``parse`` is pure (tested on captured text); ``read`` does the HTTP GET.
"""

from __future__ import annotations

import re
import urllib.request
from dataclasses import dataclass
from typing import Optional

_LINE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class MetricsError(RuntimeError):
    """The server's /metrics lacks what the monitor needs (stats off, or another vLLM version)."""


@dataclass(frozen=True)
class VllmReading:
    kv_used: float
    running: int
    waiting: int
    kv_capacity_tokens: int

    @property
    def kv_tokens(self) -> int:
        return int(round(self.kv_used * self.kv_capacity_tokens))


def parse(text: str) -> VllmReading:
    gauges: dict[str, float] = {}
    info: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        name = m["name"]
        if name == "vllm:cache_config_info":
            info = dict(_LABEL.findall(m["labels"] or ""))
        elif name in ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"):
            # one engine per verl server: several label sets would be data-parallel engines; sum them
            gauges[name] = gauges.get(name, 0.0) + float(m["value"])
    missing = [k for k in ("vllm:kv_cache_usage_perc", "vllm:num_requests_running") if k not in gauges]
    if missing:
        raise MetricsError(f"/metrics has no {missing}: start the servers with "
                           "actor_rollout_ref.rollout.disable_log_stats=false (repack needs vLLM's stats)")
    try:
        capacity = int(info["num_gpu_blocks"]) * int(info["block_size"])
    except (KeyError, ValueError) as e:
        raise MetricsError(f"/metrics has no usable vllm:cache_config_info (num_gpu_blocks, block_size): {info}") from e
    return VllmReading(kv_used=gauges["vllm:kv_cache_usage_perc"], running=int(gauges["vllm:num_requests_running"]),
                       waiting=int(gauges.get("vllm:num_requests_waiting", 0)), kv_capacity_tokens=capacity)


def read(address: str, timeout_s: float = 2.0, opener: Optional[urllib.request.OpenerDirector] = None) -> VllmReading:
    """GET http://<address>/metrics (``address`` is verl's server address, host:port)."""
    host = address if address.startswith("http") else f"http://{address}"
    # the servers are this job's own processes: never route their metrics through a proxy
    op = opener or urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with op.open(f"{host}/metrics", timeout=timeout_s) as resp:
        return parse(resp.read().decode("utf-8", "replace"))
