"""Client for a SandboxFusion-compatible `/run_code` HTTP service (for clusters that run one).

Dataflow: code -> POST JSON {code, language, run_timeout, memory_limit_MB} -> response JSON ->
`parse_response` (pure) -> SandboxResult, the same type the local sandbox returns, so the tool renders both
the same way. Calls run on a private thread pool whose size is the concurrency limit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any

from verl_laminar.sandbox.result import SandboxResult, SandboxStatus, classify

logger = logging.getLogger(__name__)

# Gateway/service-unavailable answers are worth retrying; a 4xx means our request is wrong.
_RETRY_HTTP = {502, 503, 504}


class RemoteSandboxError(RuntimeError):
    """The service failed (unreachable, HTTP error, SandboxError): not the model's code's fault."""


def parse_response(payload: Any, wall_s: float) -> SandboxResult:
    if not isinstance(payload, dict):
        raise RemoteSandboxError(f"sandbox service answered {type(payload).__name__}, expected a JSON object")
    api_status = payload.get("status")
    if api_status == "SandboxError":
        raise RemoteSandboxError(f"sandbox service error: {payload.get('message', '')!s}"[:500])
    run = payload.get("run_result")
    if not isinstance(run, dict):
        compile_result = payload.get("compile_result") or {}
        if compile_result.get("stderr"):
            return SandboxResult(SandboxStatus.ERROR, compile_result.get("return_code"), "", compile_result["stderr"], wall_s)
        raise RemoteSandboxError(f"sandbox service answered status={api_status!r} without run_result")
    stdout = run.get("stdout") or ""
    stderr = run.get("stderr") or ""
    code = run.get("return_code")
    run_status = run.get("status")
    if run_status == "TimeLimitExceeded":
        status = SandboxStatus.TIMEOUT
    elif run_status == "Finished":
        status = classify(code, timed_out=False, output_over=False)
    else:
        status = SandboxStatus.ERROR
    return SandboxResult(status=status, exit_code=code, stdout=stdout, stderr=stderr, wall_s=wall_s)


class RemoteSandbox:
    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        memory_mb: int,
        max_concurrency: int,
        grace_s: float = 30.0,
        max_retries: int = 2,
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.grace_s = grace_s
        self.max_retries = max_retries
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="sbx-http")

    def _post(self, body: bytes) -> Any:
        request = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/json", "Accept": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s + self.grace_s) as response:
            return json.loads(response.read().decode("utf-8"))

    def run(self, code: str) -> SandboxResult:
        body = json.dumps(
            {
                "code": code,
                "language": "python",
                "run_timeout": self.timeout_s,
                "compile_timeout": self.timeout_s,
                "memory_limit_MB": self.memory_mb,
                "stdin": "",
                "files": {},
                "fetch_files": [],
            }
        ).encode("utf-8")
        start = time.monotonic()
        last_error = ""
        for attempt in range(self.max_retries + 1):
            try:
                payload = self._post(body)
            except urllib.error.HTTPError as e:
                last_error = f"HTTP {e.code} from {self.url}"
                if e.code not in _RETRY_HTTP:
                    break
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                last_error = f"{self.url} unreachable: {e}"
            except json.JSONDecodeError as e:
                last_error = f"{self.url} answered invalid JSON: {e}"
                break
            else:
                return parse_response(payload, time.monotonic() - start)
            logger.warning("sandbox service call %d failed: %s", attempt + 1, last_error)
            if attempt < self.max_retries:
                time.sleep(min(0.5 * (attempt + 1), 2.0))
        raise RemoteSandboxError(last_error)

    async def arun(self, code: str) -> SandboxResult:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.run, code)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
