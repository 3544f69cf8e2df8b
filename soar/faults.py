"""Fault injection for the kill/resume tests: ``SOAR_FAULT=<point>:<outer step>`` makes the process
SIGKILL itself at that point of outer step t (0-based; points: ``teacher_sample``, ``student``
(after the first student), ``checkpoint_wait`` (after the students, the previous step's background
checkpoint done), ``checkpoint`` (files written, not yet marked done)), as
an out-of-memory kill or a node failure would. ``pool_student:<step>:<group>:<k>:<j>`` kills the
pool worker that trained that student, before it returns the result (``soar.students.pool``).
``SOAR_FAULT_ONCE=<path>`` fires the fault only while ``path`` does not exist (it is created just
before the kill), so a restarted process passes. Unset, it does nothing."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def maybe_die(point: str, step) -> None:
    if os.environ.get("SOAR_FAULT") != f"{point}:{step}":
        return
    once = os.environ.get("SOAR_FAULT_ONCE")
    if once:
        if Path(once).exists():
            return
        Path(once).touch()
    os.kill(os.getpid(), signal.SIGKILL)
