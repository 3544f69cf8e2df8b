"""``soar-export``: a finished run's Promotion Questions (and fresh teacher samples) as Hugging Face
``datasets`` datasets with per-question provenance and a dataset card, plus the teacher and the
promoted students as HF checkpoints.

    soar-export runs/arith                                  # PQ + models -> runs/arith/export/
    soar-export runs/arith export.samples=128 export.teacher_step=20    # + 128 Grounded-T questions
    soar-export runs/arith_base export.pq=false export.samples=128 export.teacher_step=0   # Base-T questions
    soar-export runs/arith export.push_to_hub=me/arith-pq   # also push PQ (network + token)

Each dataset ``<out>/<name>/`` holds ``disk/`` (``save_to_disk``), ``<name>.parquet``,
``<name>.jsonl`` and ``README.md`` (the card); ``<out>/export.json`` lists everything.
A run below ``pq.min_promotions`` (e.g. 0 promotions) is refused unless ``pq.allow_ineligible``
(or ``export.pq=false``: samples and models only). An empty PQ exports with its schema intact;
``datasets.Dataset.from_parquet`` cannot read a 0-row parquet file, ``load_from_disk`` can.
A run still training is exported as of its newest finished checkpoint (``soar.rundata.read_run``), the
step printed and recorded in ``export.json``.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from omegaconf import OmegaConf

from soar.config import ConfigError, DataConfig
from soar.data import load_problems
from soar.generation import SamplingParams
from soar.grading import make_grader
from soar.models import load_model, load_tokenizer, model_context
from soar.rundata import RunData, RunDataError, check_eligible, load_teacher_state, read_json, read_run
from soar.seeding import derive_seed
from soar.teachers.sampling import sample_valid
from soar.teachers.update import TeacherPolicy

log = logging.getLogger("soar.export")

COLUMNS = {  # name -> (datasets dtype, description); the dataset card's field table
    "id": ("string", "stable question id"),
    "question": ("string", "the teacher's question"),
    "answer": ("string", "the teacher's answer (content of \\boxed{}; not verified)"),
    "source": ("string", "`pq` (Promotion Question) or `teacher_sample` (fresh sample)"),
    "run_id": ("string", "run directory name + config hash prefix"),
    "config_hash": ("string", "sha256 prefix of the run's resolved config.yaml"),
    "seed": ("int64", "the run's seed"),
    "outer_step": ("int64", "outer step (1-based) whose dataset this question belongs to (PQ)"),
    "teacher_step": ("int64", "the teacher that wrote it: its state after this many outer steps"),
    "teacher_checkpoint": ("string", "that teacher's checkpoint in the run dir ('' if not kept, 'base' at 0)"),
    "promotion": ("int64", "promotion index (1-based) that admitted the dataset to PQ"),
    "dataset": ("int64", "index of the dataset among the step's g datasets"),
    "dataset_reward": ("float64", "R_k: the dataset's mean grounded reward"),
    "replicate_rewards": ("list<float64>", "R_{k,j} of the r student replicates"),
    "promoted_student": ("string", "the student promoted with this dataset (run-dir relative)"),
}


def features():
    from datasets import Features, Sequence, Value

    return Features({name: Sequence(Value("float64")) if dtype.startswith("list") else Value(dtype)
                     for name, (dtype, _) in COLUMNS.items()})


def _teacher_path(run: RunData, step: int) -> str:
    try:
        kind, path = run.teacher_checkpoint(step)
    except RunDataError:
        return ""
    return "base" if kind == "base" else str(path.relative_to(run.path))


def pq_rows(run: RunData) -> list[dict]:
    """PQ with provenance: the loop's ``pq.jsonl`` joined with ``promotions.jsonl`` and the run's identity."""
    promoted = {p["promotion"]: p for p in run.promotions}
    rows = []
    for r in run.pq:
        try:
            rows.append({"id": r["id"], "question": r["question"], "answer": r["answer"], "source": "pq",
                         "run_id": run.run_id, "config_hash": run.config_hash, "seed": int(r["seed"]),
                         "outer_step": int(r["step"]), "teacher_step": int(r["step"]) - 1,
                         "teacher_checkpoint": _teacher_path(run, int(r["step"]) - 1),
                         "promotion": int(r["promotion"]), "dataset": int(r["dataset"]),
                         "dataset_reward": float(r["dataset_reward"]),
                         "replicate_rewards": [float(x) for x in r["replicate_rewards"]],
                         "promoted_student": promoted.get(r["promotion"], {}).get("path", "")})
        except (KeyError, TypeError, ValueError) as exc:
            raise RunDataError(f"{run.path / 'pq.jsonl'}: row {r.get('id', '?')} lacks {exc}") from exc
    return rows


def load_teacher(run: RunData, step: int | None):
    """The run's teacher after outer step ``step`` (None: the snapshot's, ``RunData.step``) as a
    ``TeacherPolicy`` (its format filter and generator), and the step it is at."""
    kind, path = run.teacher_checkpoint(step)
    if step is None:
        step = int(path.parent.name.split("_")[1]) if kind == "state" else int(path.name.split("_")[1])
    cfg = OmegaConf.merge(run.config, {"teacher": {"kl_coef": 0.0}})  # no reference copy needed
    if kind == "hf":  # merged weights: no adapter to rebuild
        cfg = OmegaConf.merge(cfg, {"model": {"path": str(path)}, "teacher": {"lora": {"r": 0}}})
    tokenizer, model = load_tokenizer(cfg.model), load_model(cfg.model)
    teacher = TeacherPolicy(cfg, model, tokenizer, make_grader(cfg.data.grader), cfg.data.prompt_template,
                            model_context(model, cfg.model))
    if kind == "state":
        teacher.trainer.load_state_dict(load_teacher_state(run, path))
    return teacher, step


def sample_rows(run: RunData, teacher, step: int, count: int) -> tuple[list[dict], dict]:
    """``count`` fresh (question, answer) pairs from ``teacher`` (the run's teacher after ``step``)
    through the loop's format filter (``soar.teachers.sampling.sample_valid`` with ``TeacherPolicy.parse``)."""
    t = run.config.teacher
    params = SamplingParams(temperature=t.temperature, max_tokens=t.max_tokens, stop=tuple(t.stop))
    rollouts, metrics = sample_valid(teacher.trainer.sampler(), t.prompt, count, params, teacher.parse,
                                     t.sample_batch or count, int(t.max_attempts_factor * count),
                                     derive_seed(run.config.seed, "export_samples"), step)
    checkpoint = _teacher_path(run, step)
    rows = [{"id": f"{run.run_id}/t{step}/sample{i}", "question": r.question, "answer": r.answer,
             "source": "teacher_sample", "run_id": run.run_id, "config_hash": run.config_hash,
             "seed": int(run.config.seed), "outer_step": None, "teacher_step": step, "teacher_checkpoint": checkpoint,
             "promotion": None, "dataset": None, "dataset_reward": None, "replicate_rewards": [],
             "promoted_student": ""} for i, r in enumerate(rollouts)]
    return rows, metrics


def dataset_card(name: str, rows: list[dict], run: RunData, notes: list[str]) -> str:
    fields = "\n".join(f"| `{c}` | {dtype} | {desc} |" for c, (dtype, desc) in COLUMNS.items())
    promos = "\n".join(f"| {p['promotion']} | {p['step']} | {p['dataset_reward']:+.4f} | "
                       f"{p.get('hard_train_acc', float('nan')):.3f} | {p.get('hard_test_acc', float('nan')):.3f} |"
                       for p in run.promotions) or "| - | - | - | - | - |"
    cfg = run.config
    return f"""---
pretty_name: "SOAR {name} ({run.run_id})"
size_categories: [n<1K]
tags: [soar, synthetic, self-play, math]
configs:
- config_name: default
  data_files: {name}.parquet
---
# SOAR {name}: `{run.run_id}`

{"Promotion Questions (PQ)" if name == "pq" else "Fresh teacher samples"} written by the teacher of a
SOAR run (arXiv 2601.18778): {len(rows)} question-answer pairs. Answers are the teacher's own and are not
verified. Exported by `soar-export` from `{run.path}`.

- run id `{run.run_id}`, config hash `{run.config_hash}`, seed {cfg.seed}
- base model `{cfg.model.path}`; teacher reward `{cfg.teacher.reward}`, frozen: {cfg.teacher.frozen}
- outer steps {len(run.metrics)}, promotions {len(run.promotions)} (tau {cfg.promotion.tau}, window {cfg.promotion.window})
- g={cfg.teacher.datasets} datasets of n={cfg.teacher.questions_per_dataset}, r={cfg.inner.replicates} students, \
M={cfg.inner.reward_questions}
{"".join(f"- **note:** {n}{chr(10)}" for n in notes)}
## Promotions

| promotion | outer step | dataset reward | promoted student hard-train acc | hard-test acc |
|---|---|---|---|---|
{promos}

## Fields

| field | type | meaning |
|---|---|---|
{fields}

Files: `disk/` (`datasets.load_from_disk`), `{name}.parquet`, `{name}.jsonl`.
"""


def write_dataset(rows: list[dict], folder: Path, name: str, card: str):
    """``save_to_disk``, parquet and JSONL copies of ``rows`` plus ``README.md``; returns the Dataset."""
    import datasets

    ds = datasets.Dataset.from_list(rows, features=features()) if rows else \
        datasets.Dataset.from_dict({c: [] for c in COLUMNS}, features=features())
    folder.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder / "disk", ignore_errors=True)
    ds.save_to_disk(str(folder / "disk"), num_shards=None if rows else 1)  # 0 shards would not load back
    ds.to_parquet(str(folder / f"{name}.parquet"))
    with open(folder / f"{name}.jsonl", "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    (folder / "README.md").write_text(card)
    return ds


def push_dataset(ds, folder: Path, repo_id: str, private: bool) -> str:
    """Push a dataset and its card to the hub (needs network and ``HF_TOKEN`` / a login)."""
    from huggingface_hub import HfApi

    ds.push_to_hub(repo_id, private=private)
    HfApi().upload_file(path_or_fileobj=str(folder / "README.md"), path_in_repo="README.md", repo_id=repo_id,
                        repo_type="dataset")
    return f"https://huggingface.co/datasets/{repo_id}"


def export_models(run: RunData, teacher, teacher_step: int, out: Path) -> list[str]:
    """The teacher (merged, plus ``adapter/`` with LoRA) and every promoted student, HF format."""
    written = []
    if teacher is not None:
        folder = out / f"teacher_step_{teacher_step:06d}"
        shutil.rmtree(folder, ignore_errors=True)
        teacher.trainer.save_pretrained(folder)
        written.append(str(folder))
    for p in run.promotions:
        src = run.path / p["path"]
        if not (src / "config.json").is_file():
            raise RunDataError(f"{src / 'config.json'}: missing (promoted student {p['promotion']})")
        dst = out / src.name
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
        written.append(str(dst))
    return written


def run_export(cfg) -> dict:
    """The ``soar-export`` stage; returns (and writes) ``export.json``."""
    e = cfg.export
    if not e.run_dir:
        raise ConfigError("config error: export.run_dir: give the run directory (soar-export RUN_DIR)")
    run = read_run(e.run_dir)
    eligible = check_eligible(run, cfg.pq, "export") if e.pq else None
    out = Path(e.out or run.path / "export").expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"run_dir": str(run.path), "run_id": run.run_id, "config_hash": run.config_hash, "step": run.step,
                "promotions": len(run.promotions), "eligible": eligible, "datasets": {}, "models": []}
    log.info("exporting %s as of outer step %s (its newest finished checkpoint)", run.path, run.step)
    ds = None
    if e.pq:
        notes = [] if eligible else [f"ineligible run exported with pq.allow_ineligible: {len(run.promotions)} "
                                     f"promotions (pq.min_promotions={cfg.pq.min_promotions})"]
        rows = pq_rows(run)
        ds = write_dataset(rows, out / "pq", "pq", dataset_card("pq", rows, run, notes))
        manifest["datasets"]["pq"] = {"rows": len(rows), "folder": "pq"}
    teacher = teacher_step = None
    if e.samples > 0 or e.models:
        teacher, teacher_step = load_teacher(run, e.teacher_step)
    if e.samples > 0:
        samples, metrics = sample_rows(run, teacher, teacher_step, e.samples)
        name = f"teacher_step_{teacher_step:06d}"
        write_dataset(samples, out / name, name, dataset_card(name, samples, run, [
            f"{len(samples)} fresh samples of the teacher after outer step {teacher_step}; "
            f"valid fraction {metrics['teacher/valid_frac']:.3f}"]))
        manifest["datasets"][name] = {"rows": len(samples), "folder": name, "teacher_step": teacher_step,
                                      "sampling": metrics}
    if e.models:
        manifest["models"] = export_models(run, teacher, teacher_step, out / "models")
    if e.push_to_hub and ds is not None:
        manifest["hub"] = push_dataset(ds, out / "pq", e.push_to_hub, e.private)
    (out / "export.json").write_text(json.dumps(manifest, indent=2))
    print(json.dumps({"out": str(out), "step": run.step, **{k: v["rows"] for k, v in manifest["datasets"].items()}}))
    return manifest


def load_questions(path: str | Path, data_cfg=None, name: str | None = None):
    """Problems from a ``soar-export`` folder (its root means ``pq``; a dataset folder; ``disk/``) or
    any file / folder ``soar.data.load_problems`` reads. Provenance columns land in ``Problem.meta``."""
    p = Path(path).expanduser().resolve()
    if p.is_dir() and (p / "export.json").is_file():
        read_json(p / "export.json")  # a corrupt manifest is named
        p = p / "pq"
    if p.is_dir() and (p / f"{p.name}.parquet").exists():
        p = p / f"{p.name}.parquet"
    if p.is_dir() and not any((p / f).exists() for f in ("dataset_info.json", "dataset_dict.json")):
        raise RunDataError(f"{p}: not a soar-export dataset folder (no {p.name}.parquet) nor a save_to_disk folder")
    if not p.exists():
        raise RunDataError(f"{p}: missing")
    base = data_cfg if data_cfg is not None else OmegaConf.structured(DataConfig)
    dcfg = OmegaConf.merge(base, {"path": str(p), "name": name or p.stem, "problem_key": "question",
                                  "answer_key": "answer", "id_key": "id", "limit": None})
    try:
        return load_problems(dcfg)
    except Exception as exc:
        if isinstance(exc, RunDataError):
            raise
        raise RunDataError(f"{p}: cannot be read ({exc})") from exc
