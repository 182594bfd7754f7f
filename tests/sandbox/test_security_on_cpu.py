"""Attacks on the local sandbox; each test asserts the attack failed (and a harmless control succeeded).

Runs as whatever user pytest runs as; in CI that is root, the case where RLIMIT_NPROC alone does nothing.
Network checks only ever touch a listener this test opens on 127.0.0.1.
"""

import os
import shutil
import socket
import time
import uuid

import pytest

from verl_laminar.sandbox import LocalSandbox, SandboxConfig, SandboxStatus

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap not installed: apt-get install -y bubblewrap"
)


@pytest.fixture(scope="module")
def sandbox():
    box = LocalSandbox(SandboxConfig(timeout_s=3, cpu_time_s=5, memory_mb=256, max_processes=16, max_output_bytes=64 * 1024))
    yield box
    box.close()


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue  # the process ended while we looked
    return found


def test_runs_unprivileged_without_capabilities(sandbox):
    result = sandbox.run(
        "import os\n"
        "caps = [l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1]\n"
        "print(os.getuid(), os.geteuid(), int(caps, 16))"
    )
    assert result.ok, result.stderr
    uid, euid, caps = map(int, result.stdout.split())
    assert uid != 0 and euid != 0
    assert caps == 0


def test_cannot_read_host_file_outside_allowlist(sandbox, tmp_path):
    secret = tmp_path / "secret.txt"
    token = uuid.uuid4().hex
    secret.write_text(token)
    code = (
        "paths = [%r, '/proc/1/root' + %r, '/etc/shadow', '/etc/hostname', %r]\n"
        "for p in paths:\n"
        "    try:\n"
        "        print('READ', p, open(p).read())\n"
        "    except OSError as e:\n"
        "        print('DENIED', p, type(e).__name__)\n"
    ) % (str(secret), str(secret), os.path.join(os.path.expanduser("~"), ".bashrc"))
    result = sandbox.run(code)
    assert result.ok, result.stderr
    assert token not in result.stdout
    assert "READ" not in result.stdout
    assert result.stdout.count("DENIED") == 5


def test_cannot_write_outside_temp_dir(sandbox, tmp_path):
    host_target = tmp_path / "escape.txt"
    code = (
        "import os\n"
        "for p in [%r, '/usr/escape', '/escape', '/sandbox/escape', '/proc/1/root' + '/usr/escape']:\n"
        "    try:\n"
        "        open(p, 'w').write('x')\n"
        "        print('WROTE', p)\n"
        "    except OSError as e:\n"
        "        print('DENIED', p, type(e).__name__)\n"
        "open('/tmp/inside.txt', 'w').write('ok')\n"
        "print('TMP', open('/tmp/inside.txt').read())\n"
    ) % str(host_target)
    result = sandbox.run(code)
    assert result.ok, result.stderr
    assert "WROTE" not in result.stdout
    assert result.stdout.count("DENIED") == 5
    assert "TMP ok" in result.stdout  # control: the sandbox's own temp dir is writable
    assert not host_target.exists()
    assert not os.path.exists("/usr/escape") and not os.path.exists("/escape")


def test_cannot_connect_to_host_loopback_listener(sandbox):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        # control: the listener accepts connections from the host
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        time.sleep(0.05)
        listener.accept()[0].close()
        code = (
            "import socket\n"
            "try:\n"
            "    socket.create_connection(('127.0.0.1', %d), timeout=2)\n"
            "    print('CONNECTED')\n"
            "except OSError as e:\n"
            "    print('BLOCKED', type(e).__name__)\n"
        ) % port
        result = sandbox.run(code)
        assert result.ok, result.stderr
        assert "BLOCKED" in result.stdout and "CONNECTED" not in result.stdout
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing from the sandbox reached the listener
    finally:
        listener.close()


def test_process_limit_holds(sandbox):
    # Each child sleeps so they are all alive at once; the parent counts how many forks succeed.
    code = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    for _ in range(200):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(2)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('LIMIT', type(e).__name__)\n"
        "print('FORKED', n)\n"
    )
    result = sandbox.run(code)
    assert "LIMIT" in result.stdout, result.stdout + result.stderr
    forked = int(result.stdout.split("FORKED")[1].split()[0])
    assert forked < sandbox.config.max_processes


def test_fork_bomb_is_contained(sandbox):
    marker = f"forkbomb-{uuid.uuid4().hex}"
    # Re-exec once with a marker in argv so every forked copy can be found on the host afterwards.
    code = (
        "import os, sys\n"
        "if len(sys.argv) == 1:\n"
        f"    os.execv(sys.executable, [sys.executable, '/sandbox/main.py', '{marker}'])\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        pass\n"
    )
    start = time.monotonic()
    result = sandbox.run(code)
    assert result.status is SandboxStatus.TIMEOUT
    assert time.monotonic() - start < sandbox.config.timeout_s + 5
    deadline = time.monotonic() + 2
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_with(marker) == []
    assert sandbox.run("print('alive')").stdout.strip() == "alive"  # the sandbox still works afterwards


def test_memory_bomb_is_stopped(sandbox):
    result = sandbox.run("chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n")
    assert result.status in (SandboxStatus.ERROR, SandboxStatus.KILLED)
    assert "MemoryError" in result.stderr or result.status is SandboxStatus.KILLED
    assert sandbox.run("print(len(bytearray(8 << 20)))").stdout.strip() == str(8 << 20)  # control


def test_infinite_loop_times_out():
    box = LocalSandbox(SandboxConfig(timeout_s=1.5, cpu_time_s=30))
    try:
        start = time.monotonic()
        result = box.run("while True:\n    pass\n")
        assert result.status is SandboxStatus.TIMEOUT
        assert time.monotonic() - start < 1.5 + 4
    finally:
        box.close()


def test_cpu_time_limit_kills_busy_loop():
    box = LocalSandbox(SandboxConfig(timeout_s=30, cpu_time_s=1))
    try:
        start = time.monotonic()
        result = box.run("while True:\n    pass\n")
        assert result.status is SandboxStatus.KILLED
        assert time.monotonic() - start < 10
    finally:
        box.close()


def test_huge_output_is_capped(sandbox):
    start = time.monotonic()
    result = sandbox.run("while True:\n    print('x' * 4096)\n")
    assert result.status is SandboxStatus.OUTPUT_LIMIT
    assert result.truncated
    assert len(result.stdout.encode()) <= sandbox.config.max_output_bytes
    assert time.monotonic() - start < sandbox.config.timeout_s + 2


@pytest.mark.parametrize("ending", ["return", "timeout"])
def test_no_child_process_outlives_the_call(sandbox, ending):
    marker = f"leftover-{uuid.uuid4().hex}"
    code = (
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)  # {marker}'], start_new_session=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(120)  # {marker}'])\n"
        "time.sleep(0.5)\n"
        "print('spawned')\n"
    )
    if ending == "timeout":
        code += "time.sleep(60)\n"
    result = sandbox.run(code)
    assert "spawned" in result.stdout
    assert result.status is (SandboxStatus.OK if ending == "return" else SandboxStatus.TIMEOUT)
    deadline = time.monotonic() + 2
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_with(marker) == []


def test_closing_the_pipes_does_not_escape_the_deadline(sandbox):
    start = time.monotonic()
    result = sandbox.run("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)\n")
    assert result.status is SandboxStatus.TIMEOUT
    assert time.monotonic() - start < sandbox.config.timeout_s + 4
