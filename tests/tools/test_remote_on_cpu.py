"""The remote (SandboxFusion-compatible) backend against a fake service on 127.0.0.1."""

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from verl_laminar.sandbox.result import SandboxStatus
from verl_laminar.tools.code_interpreter import CodeInterpreterTool
from verl_laminar.tools.remote import RemoteSandbox, RemoteSandboxError, parse_response


class FakeSandboxFusion:
    """Answers like SandboxFusion's /run_code; the code text selects the behaviour."""

    def __init__(self):
        self.requests = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.failures_left = 0
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.requests.append(body)
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                    fail = fake.failures_left > 0
                    fake.failures_left -= fail
                try:
                    status, payload = fake.answer(body["code"], fail)
                finally:
                    with fake.lock:
                        fake.in_flight -= 1
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/run_code"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, code, fail):
        if fail:
            return 503, {"detail": "busy"}
        if code.startswith("sleep"):
            time.sleep(0.3)
        if code == "timeout":
            return 200, {"status": "Failed", "run_result": {"status": "TimeLimitExceeded", "stdout": "partial", "stderr": "", "return_code": None}}
        if code == "crash":
            return 200, {"status": "SandboxError", "message": "no workers"}
        if code == "error":
            return 200, {"status": "Failed", "run_result": {"status": "Finished", "stdout": "", "stderr": "NameError: x", "return_code": 1}}
        return 200, {"status": "Success", "run_result": {"status": "Finished", "stdout": f"ran {code}\n", "stderr": "", "return_code": 0, "execution_time": 0.01}}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service():
    fake = FakeSandboxFusion()
    yield fake
    fake.close()


def test_request_payload_and_result_mapping(service):
    remote = RemoteSandbox(service.url, timeout_s=7, memory_mb=300, max_concurrency=2)
    result = remote.run("print(1)")
    assert result.status is SandboxStatus.OK and result.stdout == "ran print(1)\n"
    sent = service.requests[-1]
    assert sent["code"] == "print(1)" and sent["language"] == "python"
    assert sent["run_timeout"] == 7 and sent["memory_limit_MB"] == 300
    assert remote.run("timeout").status is SandboxStatus.TIMEOUT
    failed = remote.run("error")
    assert failed.status is SandboxStatus.ERROR and failed.exit_code == 1 and "NameError" in failed.stderr
    with pytest.raises(RemoteSandboxError, match="no workers"):
        remote.run("crash")


def test_retries_busy_service(service):
    service.failures_left = 2
    remote = RemoteSandbox(service.url, timeout_s=5, memory_mb=256, max_concurrency=1, max_retries=2)
    assert remote.run("print(2)").ok
    assert len(service.requests) == 3


def test_tool_uses_remote_url_with_a_concurrency_limit(service):
    tool = CodeInterpreterTool({"sandbox_fusion_url": service.url, "max_concurrency": 2, "timeout_s": 5})

    async def burst():
        return await asyncio.gather(*(tool.execute(str(i), {"code": f"sleep{i}"}) for i in range(6)))

    results = asyncio.run(burst())
    assert sorted(r[0].text for r in results) == [f"ran sleep{i}" for i in range(6)]
    assert service.max_in_flight <= 2


def test_unreachable_service_does_not_break_the_rollout():
    # A loopback port nobody listens on: connection refused.
    import socket

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    tool = CodeInterpreterTool({"sandbox_fusion_url": f"http://127.0.0.1:{port}/run_code", "timeout_s": 1})
    tool.backend.max_retries = 0
    response, _, metrics = asyncio.run(tool.execute("i", {"code": "print(1)"}))
    assert metrics["status"] == "sandbox_error"
    assert "unavailable" in response.text


@pytest.mark.parametrize("payload", [[], {"status": "Success"}, "text"])
def test_malformed_service_answers_are_service_errors(payload):
    with pytest.raises(RemoteSandboxError):
        parse_response(payload, 0.1)
