"""The one place where Laminar code differs by vLLM version (verl 0.9.1's vLLM 0.24.0 on GPUs, 0.31.0 on the CPU path).

Every vLLM member Laminar uses is listed in ``patches.vllm_api`` and checked against both versions; what is here is
the code that asks the running vLLM which shape it has, so the callers need not. Listed in patches/README.md.

* ``abort_takes_internal``: verl 0.9.1's ``vLLMHttpServer.abort_request`` calls
  ``OutputProcessor.abort_requests([id])``; since vLLM 0.24 (both supported versions) it also takes ``internal``,
  and verl's call then raises after queueing the ABORT output, leaving the engine core decoding the request.
  The streaming server aborts through ``AsyncLLM.abort(id, internal=True)`` when this is true.
* ``reload_into``: vLLM's in-place ``reload_weights`` (layerwise: re-packs what the kernels packed), or the model's
  ``load_weights`` on a runner that has none.
"""

from __future__ import annotations

import inspect
from typing import Any, Iterable


def abort_takes_internal(output_processor: Any) -> bool:
    """Whether this vLLM's ``OutputProcessor.abort_requests`` takes ``internal`` (verl 0.9.1 calls it without)."""
    return "internal" in inspect.signature(output_processor.abort_requests).parameters


def reload_into(model_runner: Any, weights: Iterable) -> None:
    """Load ``weights`` ((name, tensor) pairs) into a running worker's model."""
    if hasattr(model_runner, "reload_weights"):
        model_runner.reload_weights(weights_iterator=weights)
    else:
        model_runner.get_model().load_weights(weights=weights)
