"""The ``python_sandbox`` tool's executor: a role's code run in a subprocess with limits (``team.sandbox``,
``soar.config.SandboxConfig``).

What it guarantees (``tests/test_team_sandbox.py`` checks each):

- **time**: ``RLIMIT_CPU`` (``cpu_s``) and a wall-clock limit (``timeout_s``) after which the whole process
  group is killed (``SIGKILL``);
- **memory**: ``RLIMIT_AS`` (``memory_mb``) on the address space of each process; ``RLIMIT_FSIZE`` (``file_mb``)
  on any file it writes; no core dumps;
- **its own temp dir**: a fresh temporary directory is its working directory, ``HOME`` and ``TMPDIR``, and is
  removed afterwards; the environment is cleared (no inherited variables, tokens or proxies) and Python runs
  isolated (``-I``: no user site-packages, no ``PYTHON*`` variables, the script's folder not on the path);
- **no network** with ``network=namespace`` (or ``auto`` where available): a new user and network namespace
  (``unshare -rn``) holds only a loopback interface that is down, so no address outside can be reached.

What it does not guarantee: the filesystem is not isolated (no chroot or mount namespace): code can read
what the user running ``soar-team`` can, and write where that user can (within ``file_mb`` per file); a
process that calls ``setsid`` leaves the process group and escapes the wall-clock kill (its CPU limit still
holds); the number of processes is not limited (``RLIMIT_NPROC`` does not bind root). With ``network=python``
(where namespaces are unavailable) only Python's ``socket`` module is disabled: native code can still open
sockets. The tool reports which isolation ran (``SandboxResult.network``).
"""

from __future__ import annotations

import functools
import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

NETWORK_MODES = ("auto", "namespace", "python")
SOCKET_GUARD = (
    "import socket as _s\n"
    "def _no_network(*a, **k):\n    raise OSError('network disabled by the soar sandbox')\n"
    "_s.socket = _s.create_connection = _s.getaddrinfo = _s.socketpair = _no_network\n"
    "del _s, _no_network\n"
)
"""Prepended to the code under ``network=python``: Python's socket module refuses to connect."""


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None
    """None when killed at the wall-clock limit."""
    timed_out: bool
    network: str
    """The isolation that ran: ``namespace`` or ``python``."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@functools.cache
def namespaces_available() -> bool:
    """Whether ``unshare -rn`` can start a process here (user namespaces may be disabled in containers)."""
    try:
        return subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def isolation(mode: str) -> str:
    """The isolation ``mode`` gives here: ``namespace`` or ``python``; ``namespace`` unavailable is an error."""
    if mode not in NETWORK_MODES:
        raise ValueError(f"team.sandbox.network: must be one of {NETWORK_MODES}, got {mode!r}")
    if mode == "python":
        return "python"
    if namespaces_available():
        return "namespace"
    if mode == "namespace":
        raise RuntimeError("team.sandbox.network=namespace: `unshare -rn` cannot start a process here (user "
                           "namespaces disabled?); use network=python, which only disables Python's socket module")
    return "python"


def _limit(cpu_s: int, memory_mb: int, file_mb: int) -> None:
    """In the child before exec: its own process group and the resource limits."""
    os.setsid()
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20, file_mb << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n[... {len(text) - limit} more characters]"


def run_python(code: str, cfg) -> SandboxResult:
    """Run ``code`` under ``cfg`` (``SandboxConfig``); never raises for what the code does."""
    mode = isolation(cfg.network)
    with tempfile.TemporaryDirectory(prefix="soar-sandbox-") as tmp:
        script = Path(tmp) / "main.py"
        script.write_text((SOCKET_GUARD if mode == "python" else "") + code)
        command = [sys.executable, "-I", str(script)]
        if mode == "namespace":
            command = ["unshare", "-rn", *command]
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
        proc = subprocess.Popen(command, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace",
                                preexec_fn=functools.partial(_limit, cfg.cpu_s, cfg.memory_mb, cfg.file_mb))
        try:
            out, err = proc.communicate(timeout=cfg.timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = proc.communicate()
            timed_out = True
    return SandboxResult(_cut(out, cfg.max_output_chars), _cut(err, cfg.max_output_chars),
                         None if timed_out else proc.returncode, timed_out, mode)
