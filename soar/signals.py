"""Graceful stop for batch schedulers: SIGTERM (``scancel``, preemption) and SIGUSR1 (``#SBATCH
--signal=B:USR1@300``, sent before the time limit) make ``soar-train`` finish the outer step it is
in, write its checkpoint and exit with ``EXIT_STOPPED`` (75, EX_TEMPFAIL: "try again"). The
requeued job resumes from that checkpoint (``run.resume=auto``). Repeated signals change nothing
(``scancel --signal=USR1 --batch`` reaches the stage both directly and through the batch script);
SLURM's SIGKILL after ``KillWait`` ends a step that takes too long, and the run then resumes from
the previous checkpoint (they are atomic). During setup (world pretraining, the fail@k hard set,
loading the models) there is no step to finish: the signal stops the stage at once, with
``StoppedDuringSetup``, and the command says so, and where a rerun resumes, and exits 75 (finished
fail@k batches are kept). SIGINT (Ctrl-C) stops any command at once: one line saying where a rerun
resumes, exit 130 (``soar.cli``).

    stop = StopRequest.install(setting_up=True)  # before setup
    ...                                          # setup: a signal raises StoppedDuringSetup
    stop.setup_done()                            # the loop starts
    for t in ...:
        if stop.requested: break                 # a step boundary
    stop.exit_if_requested(step, total)          # SystemExit(75) after cleanup, if steps remain
"""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger("soar.signals")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
EXIT_STOPPED = 75
"""Exit status of a run stopped by a signal at a step boundary (``slurm/soar.sbatch`` requeues on it)."""


EXIT_INTERRUPTED = 130
"""Exit status after SIGINT (Ctrl-C), the shell's 128 + 2."""


class StoppedDuringSetup(BaseException):
    """A stop signal arrived while the stage was still setting up (no outer step to finish). A
    ``BaseException``, as ``KeyboardInterrupt``: no ``except Exception`` on the way up swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signal_name = signal.Signals(signum).name


class StopRequest:
    def __init__(self, setting_up: bool = False):
        self.signum: int | None = None
        self.setting_up = setting_up
        self._previous: dict = {}

    @classmethod
    def install(cls, signals=STOP_SIGNALS, setting_up: bool = False) -> "StopRequest":
        """Catch ``signals`` until ``restore`` (a no-op outside the main thread, where Python cannot).
        ``setting_up``: a signal raises ``StoppedDuringSetup`` until ``setup_done``."""
        self = cls(setting_up)
        if threading.current_thread() is threading.main_thread():
            for signum in signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def setup_done(self) -> None:
        """From now on a signal waits for the step boundary."""
        self.setting_up = False

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            return
        self.signum = signum
        if self.setting_up:
            raise StoppedDuringSetup(signum)
        log.warning("%s: stopping after this outer step and its checkpoint", signal.Signals(signum).name)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def exit_if_requested(self, step: int, total: int | None = None) -> None:
        """SystemExit(75) if a signal arrived and steps remain (``step`` done of ``total``)."""
        self.restore()
        if self.signum is not None and (total is None or step < total):
            name = signal.Signals(self.signum).name
            if step == 0:  # stopped before the first step: there is no checkpoint to speak of
                print(f"soar: stopped by {name} before outer step 1; nothing to checkpoint, exit {EXIT_STOPPED}",
                      flush=True)
                raise SystemExit(EXIT_STOPPED)
            log.warning("stopped by %s after outer step %d (checkpointed); resume with run.resume=auto", name, step)
            print(f"soar: stopped by {name} after outer step {step}; checkpointed, exit {EXIT_STOPPED}", flush=True)
            raise SystemExit(EXIT_STOPPED)
