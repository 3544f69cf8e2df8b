"""The ``python_sandbox`` tool's executor (``soar.team.sandbox``): each guarantee its docstring makes, shown to
fail where it must (a server the sandbox cannot reach is reached by the same code run outside it)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest

from soar.config import SandboxConfig
from soar.team.formats import ToolCall, python_sandbox
from soar.team.sandbox import namespaces_available, run_python

pytestmark = pytest.mark.timeout(120)


def cfg(**kw) -> SandboxConfig:
    return SandboxConfig(**{"timeout_s": 10.0, "cpu_s": 5, "memory_mb": 256, **kw})


def test_runs_code_in_its_own_temp_dir_with_a_cleared_environment(monkeypatch):
    monkeypatch.setenv("SOAR_SECRET_TOKEN", "hunter2")
    res = run_python("import os, sys\nprint(os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR'])\n"
                     "print(os.environ.get('SOAR_SECRET_TOKEN'))\nprint(sys.flags.isolated)\nprint(os.getcwd())", cfg())
    assert res.ok, res.stderr
    same, secret, isolated, cwd = res.stdout.split()
    assert (same, secret, isolated) == ("True", "None", "1")
    assert cwd.rsplit("/", 1)[-1].startswith("soar-sandbox-") and not os.path.exists(cwd)  # removed afterwards


def test_cpu_and_wall_clock_limits():
    spin = run_python("while True: pass", cfg(cpu_s=1))
    assert not spin.ok and spin.returncode != 0  # SIGXCPU / SIGKILL at the CPU limit
    sleep = run_python("import time\ntime.sleep(60)", cfg(timeout_s=1.0))
    assert sleep.timed_out and sleep.returncode is None


def test_memory_limit():
    res = run_python("x = bytearray(1 << 30)\nprint('allocated')", cfg(memory_mb=256))
    assert not res.ok and "MemoryError" in res.stderr and "allocated" not in res.stdout
    assert run_python("x = bytearray(16 << 20)\nprint('allocated')", cfg(memory_mb=256)).stdout.strip() == "allocated"


def test_output_is_cut():
    res = run_python("print('x' * 5000)", cfg(max_output_chars=100))
    assert res.stdout.startswith("x" * 100) and "more characters" in res.stdout and len(res.stdout) < 200


@pytest.fixture
def local_server():
    """A TCP server on this machine's loopback that answers 'hello'."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.sendall(b"hello")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()


CONNECT = "import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=3)\nprint(s.recv(5).decode())"


def test_network_is_unreachable_in_the_namespace(local_server):
    if not namespaces_available():
        pytest.skip("unshare -rn is not available here (user namespaces disabled)")
    code = CONNECT.format(port=local_server)
    outside = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert outside.stdout.strip() == "hello"  # the server answers code run outside the sandbox
    res = run_python(code, cfg(network="namespace"))
    assert res.network == "namespace" and not res.ok and "hello" not in res.stdout


def test_python_guard_disables_sockets(local_server):
    res = run_python(CONNECT.format(port=local_server), cfg(network="python"))
    assert res.network == "python" and not res.ok and "network disabled by the soar sandbox" in res.stderr


def test_the_tool_runs_the_last_code_block():
    from types import SimpleNamespace

    call = ToolCall(SimpleNamespace(team=SimpleNamespace(sandbox=cfg())), "2+3?",
                    {"solver": "First try:\n```python\nprint(1)\n```\nBetter:\n```python\nprint(2 + 3)\n```\nFINAL: 5"})
    out = python_sandbox(call)
    assert out.ok and out.shown == "5"
    assert python_sandbox(ToolCall(call.cfg, "q", {"solver": "no code"})).reason == "no_code"
    bad = python_sandbox(ToolCall(call.cfg, "q", {"solver": "```python\n1/0\n```"}))
    assert not bad.ok and bad.shown == "error: ZeroDivisionError: division by zero"
