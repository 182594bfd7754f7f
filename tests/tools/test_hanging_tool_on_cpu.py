"""A tool call that never returns is cut off at the tool's timeout; the other calls of the batch are unaffected."""

import asyncio
import logging
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from verl_laminar.tools.code_interpreter import CodeInterpreterTool

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap not installed: apt-get install -y bubblewrap"
)

SLEEPS_FOREVER = "import time\nprint('started')\nwhile True:\n    time.sleep(1)"


async def _batch(tool, codes):
    return await asyncio.gather(*(tool.execute(f"call-{i}", {"code": c}) for i, c in enumerate(codes)))


@needs_bwrap
def test_local_call_that_never_returns_times_out_and_the_rest_of_the_batch_answers(caplog):
    tool = CodeInterpreterTool({"timeout_s": 1, "max_concurrency": 4})
    codes = ["print(1 + 1)", SLEEPS_FOREVER, "print('x' * 3)", "print(sum(range(5)))"]
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger="verl_laminar.tools.code_interpreter"):
        results = asyncio.run(_batch(tool, codes))
    assert time.monotonic() - start < 8
    hung_response, _, hung = results[1]
    others = [results[i] for i in (0, 2, 3)]
    assert hung["status"] == "timeout"
    assert hung_response.text.startswith("started") and "timed out" in hung_response.text  # what the model sees
    assert [r[0].text for r in others] == ["2", "xxx", "10"]
    assert all(r[2]["status"] == "ok" for r in others)
    assert "call-1 timed out" in caplog.text and "timeout_s=1" in caplog.text  # what the operator sees


class _HangingService:
    """A SandboxFusion stand-in that never answers code 'hang' (until the test ends) and runs the rest."""

    def __init__(self):
        self.release = threading.Event()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                import json

                code = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["code"]
                if code == "hang":
                    service.release.wait(30)
                    return
                data = json.dumps({"status": "Success", "run_result": {
                    "status": "Finished", "stdout": f"ran {code}\n", "stderr": "", "return_code": 0}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/run_code"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_remote_call_that_never_returns_is_a_sandbox_error_and_the_rest_of_the_batch_answers(caplog):
    service = _HangingService()
    try:
        tool = CodeInterpreterTool({"sandbox_fusion_url": service.url, "timeout_s": 1, "remote_grace_s": 0.5,
                                    "max_concurrency": 4})
        tool.backend.max_retries = 0  # one attempt: the test measures the timeout, not the retry policy
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="verl_laminar.tools"):
            results = asyncio.run(_batch(tool, ["a", "hang", "b"]))
        assert time.monotonic() - start < 6
        assert [r[0].text for r in results[::2]] == ["ran a", "ran b"]
        response, _, metrics = results[1]
        assert metrics["status"] == "sandbox_error" and "unavailable" in response.text
        assert service.url in caplog.text and "timed out" in caplog.text
    finally:
        service.close()
