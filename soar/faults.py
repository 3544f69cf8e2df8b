"""Fault injection for the kill/resume tests: ``SOAR_FAULT=<point>:<outer step>`` makes the process
SIGKILL itself at that point of outer step t (0-based; points: ``teacher_sample``, ``student``
(after the first student), ``checkpoint`` (files written, not yet marked done)), as
an out-of-memory kill or a node failure would. Unset, it does nothing."""

from __future__ import annotations

import os
import signal


def maybe_die(point: str, step: int) -> None:
    if os.environ.get("SOAR_FAULT") == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
