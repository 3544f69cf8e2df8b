"""Checking a composed config against the stage that reads it, before any heavy work: sizes, paths,
names (each read from its registry: ``soar.grading.GRADERS``, ``soar.student_rewards.STUDENT_REWARDS``,
``soar.rewards.TEACHER_REWARDS``, ``soar.policy.scores.REWARD_METRICS``) and whether the student pool
fits this machine's cores, memory (``/proc/meminfo``, through ``soar.machine.available_ram_gb``)
and GPUs. A problem is a ``ConfigError`` naming the field.

    soar.validate(soar.compose(["experiment=arith_micro"]), "train")

Context-length checks need the tokenizer (``soar.models.check_context``); a GPU run's memory plan is
``soar.memory_plan.check_plan``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from soar import machine  # machine.available_ram_gb looked up per call (tests patch it)
from soar.config import BACKEND_ROLES, BANDS, KV_CACHE_ENV, PRECISIONS, ConfigError
from soar.grading import GRADERS
from soar.hydra_config import conf_dir
from soar.memory_plan import RAY_RAM_GB, worker_ram_gb
from soar.policy.scores import REWARD_METRICS
from soar.resolve import load_callable
from soar.rewards import TEACHER_REWARDS
from soar.student_rewards import STUDENT_REWARDS
from soar.student_tasks import student_tasks_per_step

log = logging.getLogger("soar.validation")

def fail(field_name: str, message: str) -> None:
    """Raise the ``ConfigError`` of ``field_name``."""
    raise ConfigError(f"config error: {field_name}: {message}")


def validate(cfg, stage: str) -> None:
    """Check sizes, paths and resources before any heavy work: the settings every stage reads, then
    each section ``stage`` uses (``STAGE_SECTIONS``). ``stage``: rl | filter | train | eval | world | team | plan
    (or plan_rl, plan_eval, plan_filter, team_plan: ``soar-estimate --plan`` of that stage).

    Context-length checks need the tokenizer and live in ``soar.models.check_context``. Before the
    sections, what no section checks: unknown keys (``+promotion.taw=0.5``), non-finite numbers in any
    field, the model path's kind and the environment. A field set by interpolation (``teacher.max_steps:
    ${loop.steps}``) is reported at its source.
    """
    _validate_known_keys(cfg)
    _validate_finite_numbers(cfg)
    _validate_model_path_kind(cfg)
    _validate_environment()
    try:
        _validate_common(cfg)
        for section in STAGE_SECTIONS[stage]:
            _SECTION_CHECKS[section](cfg, stage)
    except ConfigError as exc:
        source = _interpolation_source(cfg, exc)
        if source is None:
            raise
        raise source from None


def _validate_known_keys(cfg) -> None:
    """Every key of a typed section is a field of its dataclass. Hydra's ``+key=value`` adds a key
    even to a typed section, so a misspelt ``+promotion.taw=0.5`` would otherwise be kept while
    ``promotion.tau`` silently stays at its default."""

    def walk(node, prefix: str) -> None:
        kind = OmegaConf.get_type(node)
        known = {f.name for f in dataclasses.fields(kind)} if dataclasses.is_dataclass(kind) else None
        for key in node.keys():
            name = f"{prefix}{key}"
            if known is not None and key not in known:
                section = prefix.rstrip(".") or "the root"
                fail(name, f"unknown key: {section} has no field {key!r} (its fields: {', '.join(sorted(known))})")
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
                walk(child, name + ".")

    walk(cfg, "")


def _validate_finite_numbers(cfg) -> None:
    """No field holds NaN or an infinity (``student.lr=nan``: Hydra parses ``nan`` and ``inf`` as
    floats, and every ``< 0`` check lets NaN through). No field means either."""

    def walk(value, name: str) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            fail(name, f"must be a finite number, got {value}")
        if isinstance(value, dict):
            for key, child in value.items():
                walk(child, f"{name}.{key}" if name else str(key))
        elif isinstance(value, list):
            for i, child in enumerate(value):
                walk(child, f"{name}[{i}]")

    walk(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False), "")


def _validate_model_path_kind(cfg) -> None:
    """A local ``model.path`` is a folder: a file there made transformers report a JSON error."""
    path = cfg.model.path
    if path not in (None, "", "???") and Path(str(path)).expanduser().is_file():
        fail("model.path", f"{path} is a file; it must be a model folder (config.json, weights, tokenizer) "
                           "or a hub id")


def _validate_environment() -> None:
    """Environment variables soar reads as numbers."""
    value = os.environ.get(KV_CACHE_ENV)
    if value is not None and value.strip() and not (value.strip().isdigit() and int(value) >= 1):
        fail(KV_CACHE_ENV, f"must be a whole number of GiB >= 1, got {value!r}; unset it or set "
                           "backend.vllm.kv_cache_gb")


def _interpolation_source(cfg, exc: ConfigError) -> ConfigError | None:
    """``exc`` restated at the field its field is interpolated from (``teacher.max_steps`` is
    ``${loop.steps}`` in the presets: ``loop.steps=-3`` is the user's value to fix); None when its
    field holds its own value."""
    prefix = "config error: "
    name, sep, message = str(exc).removeprefix(prefix).partition(": ")
    parent, _, key = name.rpartition(".")
    try:
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if node is None or not OmegaConf.is_interpolation(node, key):
            return None
        raw = node._get_node(key)._value()
    except Exception:  # not a field name (a message of another shape)
        return None
    source = raw[2:-1] if raw.startswith("${") and raw.endswith("}") and "${" not in raw[2:] else None
    if not sep or source is None or ":" in source or OmegaConf.select(cfg, source, default=None) is None:
        return None
    return ConfigError(f"{prefix}{source}: {message} ({name} is {raw})")


def _validate_common(cfg) -> None:
    cores = os.cpu_count() or 1
    if cfg.run.threads < 0 or cfg.run.threads > cores:
        fail("run.threads", f"{cfg.run.threads} threads requested but this machine has {cores} cores")
    if cfg.run.resume not in ("auto", "never", "must"):
        fail("run.resume", f"must be auto, never or must, got {cfg.run.resume!r}")
    for role in ("name",) + BACKEND_ROLES:
        value = getattr(cfg.backend, role)
        if value is not None and value not in ("auto", "hf", "vllm"):
            fail(f"backend.{role}", f"must be auto, hf or vllm, got {value!r}")
    if cfg.backend.batch_size < 1:
        fail("backend.batch_size", "must be >= 1")
    util = cfg.backend.vllm.gpu_memory_utilization
    if util is not None and not 0 < util <= 1:
        fail("backend.vllm.gpu_memory_utilization", f"must be in (0, 1] or null (sized at start), got {util}")
    if cfg.backend.vllm.weight_sync not in ("memory", "disk"):
        fail("backend.vllm.weight_sync", f"must be memory or disk, got {cfg.backend.vllm.weight_sync!r}")
    if cfg.backend.vllm.kv_cache_gb is not None and cfg.backend.vllm.kv_cache_gb < 1:
        fail("backend.vllm.kv_cache_gb", f"must be >= 1 GiB or null, got {cfg.backend.vllm.kv_cache_gb}")
    if cfg.model.dtype not in ("float32", "bfloat16", "float16"):
        fail("model.dtype", f"must be float32, bfloat16 or float16, got {cfg.model.dtype!r}")


def _validate_inputs(cfg, stage: str) -> None:
    """``model`` and ``data``: what the stage reads."""
    if cfg.model.path in (None, "", "???") and not cfg.model.build:
        fail("model.path", "is required (a hub id or a local HF folder), or model.build")
    if cfg.model.path and _looks_local(cfg.model.path) and not Path(cfg.model.path).exists():
        fail("model.path", f"local path {cfg.model.path} does not exist")
    # soar-train and soar-filter may write their pool (data.build, filter.pool); soar-rl may read band files
    builds_data = ((stage == "train" and (cfg.data.build or cfg.loop.hard_set)) or (stage == "rl" and cfg.rl.bands)
                   or (stage == "filter" and (cfg.filter.pool or cfg.data.build)) or (stage == "team" and cfg.data.build))
    if cfg.data.path in (None, "", "???") and not builds_data:
        fail("data.path", "is required (JSONL/parquet file, save_to_disk folder or hub id)")
    if cfg.data.path and _looks_local(cfg.data.path) and not Path(cfg.data.path).exists():
        fail("data.path", f"file {cfg.data.path} does not exist")
    if "{question}" not in cfg.data.prompt_template:
        fail("data.prompt_template", "must contain a {question} slot")
    if cfg.data.on_bad_row not in ("skip", "error"):
        fail("data.on_bad_row", f"must be skip or error, got {cfg.data.on_bad_row!r}")
    if cfg.data.limit is not None and cfg.data.limit < 1:
        fail("data.limit", "must be >= 1 or null")


def _validate_grader(cfg, stage: str) -> None:
    name = cfg.data.grader
    if name in GRADERS:
        return
    if ":" not in name and "." not in name:
        fail("data.grader", f"unknown grader {name!r}: one of {', '.join(GRADERS)}, or a dotted path "
                             "pkg.module:Class")
    load_callable(name, "data.grader")


def _validate_student(cfg, stage: str) -> None:
    s = cfg.student
    _validate_policy(s, "student")
    if s.group_size < 2:
        fail("student.group_size", f"RLOO needs >= 2 samples per question, got {s.group_size}")
    if s.reward not in STUDENT_REWARDS:
        fail("student.reward", f"must be one of {', '.join(STUDENT_REWARDS)}, got {s.reward!r}")
    for name in ("questions_per_step", "save_every"):
        if getattr(s, name) < 1:
            fail(f"student.{name}", f"must be >= 1, got {getattr(s, name)}")
    if cfg.data.eval_path and _looks_local(cfg.data.eval_path) and not Path(cfg.data.eval_path).exists():
        fail("data.eval_path", f"file {cfg.data.eval_path} does not exist")


def _validate_teacher(cfg, stage: str) -> None:
    t = cfg.teacher
    _validate_policy(t, "teacher")
    if t.datasets < 2:
        fail("teacher.datasets", f"set-level RLOO needs g >= 2 datasets per group, got {t.datasets}")
    for name in ("questions_per_dataset", "groups_per_step", "intrinsic_samples"):
        if getattr(t, name) < 1:
            fail(f"teacher.{name}", f"must be >= 1, got {getattr(t, name)}")
    if t.reward not in TEACHER_REWARDS:
        fail("teacher.reward", f"must be one of {', '.join(TEACHER_REWARDS)}, got {t.reward!r}")
    if not TEACHER_REWARDS[t.reward].trains_students and cfg.promotion.enabled:
        fail("promotion.enabled", f"teacher.reward={t.reward} has no students to promote (the paper's "
                                   "Intrinsic-T has no inner loop): set promotion.enabled=false")
    if t.max_attempts_factor < 1:
        fail("teacher.max_attempts_factor", "must be >= 1")


def _validate_inner(cfg, stage: str) -> None:
    inner = cfg.inner
    if inner.replicates < 1 or inner.reward_questions < 1:
        fail("inner.replicates" if inner.replicates < 1 else "inner.reward_questions", "must be >= 1")
    if inner.max_steps < cfg.student.max_steps:
        fail("inner.max_steps", f"the cap ({inner.max_steps}) is below student.max_steps ({cfg.student.max_steps})")
    if inner.accuracy_samples < 0 or inner.steps_per_promotion < 0:
        fail("inner.accuracy_samples" if inner.accuracy_samples < 0 else "inner.steps_per_promotion", "must be >= 0")
    if inner.reward_metric not in REWARD_METRICS:
        fail("inner.reward_metric", f"{inner.reward_metric!r} is not one of {tuple(REWARD_METRICS)}")
    if REWARD_METRICS[inner.reward_metric].reads_gold and "{answer}" not in inner.gold_completion:
        fail("inner.gold_completion", f"{inner.gold_completion!r} has no {{answer}} slot")


def _validate_promotion(cfg, stage: str) -> None:
    p, metric = cfg.promotion, cfg.inner.reward_metric
    if p.window < 1:
        fail("promotion.window", "must be >= 1")
    # Promotion needs a moving average > tau. Bounded metrics' rewards (and so their average) lie in
    # [-1, 1]: tau >= 1 never promotes, tau < -1 promotes every full window whatever the rewards.
    if p.enabled and REWARD_METRICS[metric].bounded and not -1 <= p.tau < 1:
        effect = "can never promote" if p.tau >= 1 else "promotes on every full window whatever the rewards"
        fail("promotion.tau", f"{p.tau} {effect}: with inner.reward_metric={metric} every reward lies in "
                               "[-1, 1]; use a tau in [-1, 1)")


def _validate_loop(cfg, stage: str) -> None:
    for name in ("steps", "checkpoint_every", "dump_every"):
        if getattr(cfg.loop, name) < 1:
            fail(f"loop.{name}", f"must be >= 1, got {getattr(cfg.loop, name)}")
    if cfg.loop.dump_completions < 0:
        fail("loop.dump_completions", f"must be >= 0, got {cfg.loop.dump_completions}")
    if cfg.loop.hard_set and not Path(cfg.loop.hard_set).expanduser().exists():
        fail("loop.hard_set", f"{cfg.loop.hard_set} does not exist (a hard-set folder, a manifest.jsonl or a JSONL)")


def _validate_resources_section(cfg, stage: str) -> None:
    _validate_resources(cfg.resources, cfg.model.path, os.cpu_count() or 1)
    _validate_pool_size(cfg)
    if cfg.resources.lockstep and cfg.student.lora.r == 0:
        fail("resources.lockstep", "lockstep students are LoRA adapters on one base: set student.lora.r > 0")
    if cfg.resources.driver_gpu_apart and cfg.resources.ray_address is None:
        fail("resources.driver_gpu_apart", "a local Ray pool (resources.ray_address null) gets every GPU, the driver's "
                                           "included; only slurm/soar.sbatch's SOAR_DRIVER_GPUS keeps it apart")
    if cfg.resources.lockstep and cfg.resources.num_workers > 0:
        fail("resources.lockstep", "lockstep students share this process's engine: set resources.num_workers=0")


def _validate_pool_size(cfg) -> None:
    """Every worker must get a student in every step: a worker beyond the step's student count never
    trains (refused). One whose count leaves the step's last round part-idle is warned about, not
    refused: students differ in length, so a spare worker still takes up slack, and the GPUs at hand
    may not divide the students."""
    workers, tasks = cfg.resources.num_workers, student_tasks_per_step(cfg)
    if workers == 0:
        return
    split = (f"teacher.groups_per_step {cfg.teacher.groups_per_step} x teacher.datasets {cfg.teacher.datasets} x "
             f"inner.replicates {cfg.inner.replicates}")
    if tasks == 0:
        fail("resources.num_workers", f"teacher.reward={cfg.teacher.reward} trains no students, so {workers} "
                                       "workers would never train one; set resources.num_workers=0")
    if workers > tasks:
        fail("resources.num_workers", f"{workers} workers for {tasks} students per step ({split}): {workers - tasks} "
                                       f"would never train one; set resources.num_workers={tasks} (or "
                                       "'${student_tasks:}'), or raise teacher.groups_per_step to give them students")
    rounds = -(-tasks // workers)
    if tasks % workers:
        enough = -(-tasks // rounds)
        log.warning(
            "resources.num_workers: %d workers train %d students per step (%s) in %d rounds, the last with %d of "
            "them busy (%.0f %% of the workers' time busy at equal student times); %d workers take the same %d rounds",
            workers, tasks, split, rounds, tasks % workers, 100 * tasks / (rounds * workers), enough, rounds)


def _validate_filter(cfg, stage: str) -> None:
    f = cfg.filter
    if f.k < 1:
        fail("filter.k", f"must be >= 1, got {f.k}")
    if f.max_tokens < 1:
        fail("filter.max_tokens", "must be >= 1")
    if f.problems_per_batch < 1:
        fail("filter.problems_per_batch", "must be >= 1")
    if not 0.0 < f.test_frac < 1.0:
        fail("filter.test_frac", f"must be in (0, 1), got {f.test_frac}")
    if f.temperature <= 0:
        fail("filter.temperature", "must be > 0")
    if any(g < 1 for g in f.mixed_group_sizes):
        fail("filter.mixed_group_sizes", f"every group size must be >= 1, got {list(f.mixed_group_sizes)}")
    for name in f.pool:
        if not (conf_dir() / "data" / f"{name}.yaml").is_file():
            fail("filter.pool", f"no data config {name!r} (conf/data/{name}.yaml)")
    if f.heldout_per_source < 0:
        fail("filter.heldout_per_source", f"must be >= 0, got {f.heldout_per_source}")
    if not 0.0 <= f.heldout_frac < 1.0:
        fail("filter.heldout_frac", f"must be in [0, 1), got {f.heldout_frac}")
    if f.heldout_frac and f.heldout_per_source:
        fail("filter.heldout_frac", f"and filter.heldout_per_source={f.heldout_per_source} are both set: set one")
    if not 0 <= f.max_overflow_frac <= 1:
        fail("filter.max_overflow_frac", f"must be in [0, 1], got {f.max_overflow_frac}")


def _validate_rl(cfg, stage: str) -> None:
    rl = cfg.rl
    unknown = [b for b in rl.band if b not in BANDS]
    if unknown or not rl.band:
        fail("rl.band", f"must be a non-empty list of {', '.join(BANDS)}, got {list(rl.band)}")
    if rl.bands is not None and not Path(rl.bands).is_dir():
        fail("rl.bands", f"{rl.bands} is not a directory (a soar-filter run dir holding bands/)")
    if rl.eval_samples < 0:
        fail("rl.eval_samples", f"must be >= 0 (0: greedy), got {rl.eval_samples}")
    if rl.eval_temperature <= 0:
        fail("rl.eval_temperature", f"must be > 0, got {rl.eval_temperature}")
    if rl.subset_size is not None and rl.subset_size < 1:
        fail("rl.subset_size", f"must be >= 1 or null (all), got {rl.subset_size}")


def _validate_distill(cfg, stage: str) -> None:
    """``distill.*`` (coach-guided context distillation in ``soar-rl``)."""
    d = cfg.distill
    if d.coach is None:
        return
    if d.coach not in ("world", "llm"):
        fail("distill.coach", f"must be null, world or llm, got {d.coach!r}")
    if d.coach == "world" and (cfg.world is None or not cfg.world.get("name")):
        fail("distill.coach", "world needs a configured world (world=<name>)")
    if d.coach == "world" and d.coach_sees_reference:
        fail("distill.coach_sees_reference", "the world's coach computes its advice from the question and reads no "
             "reference; its upper bound is distill.coach_noise=0")
    has_slot = "{reference}" in d.coach_prompt
    if d.coach == "llm" and has_slot and not d.coach_sees_reference:
        fail("distill.coach_prompt", "has a {reference} slot, but the coach sees no reference answer unless "
             "distill.coach_sees_reference=true (the oracle, an upper bound)")
    if d.coach == "llm" and d.coach_sees_reference and not has_slot:
        fail("distill.coach_prompt", "needs a {reference} slot for distill.coach_sees_reference=true")
    if not 0.0 <= d.coach_noise <= 1.0:
        fail("distill.coach_noise", f"must be in [0, 1], got {d.coach_noise}")
    if d.objective not in ("on_policy", "sft"):
        fail("distill.objective", f"must be on_policy or sft, got {d.objective!r}")
    if d.objective == "sft" and d.coef == 0:
        fail("distill.coef", "is 0 under distill.objective=sft: the teacher's correct samples would weigh nothing")
    if d.teacher not in ("frozen", "updated"):
        fail("distill.teacher", f"must be frozen or updated, got {d.teacher!r}")
    for name in ("coef", "rl_coef"):
        if getattr(d, name) < 0:
            fail(f"distill.{name}", f"must be >= 0, got {getattr(d, name)}")
    if d.coef == 0 and d.rl_coef == 0:
        fail("distill.coef", "distill.coef and distill.rl_coef are both 0: nothing to train on")
    for slot in ("{advice}", "{prompt}"):
        if slot not in d.advice_template:
            fail("distill.advice_template", f"must contain a {slot} slot")
    for name in ("max_advice_chars", "coach_max_tokens"):
        if getattr(d, name) < 1:
            fail(f"distill.{name}", f"must be >= 1, got {getattr(d, name)}")
    if d.coach_temperature < 0:
        fail("distill.coach_temperature", "must be >= 0 (0: greedy)")
    if d.dump_every < 0:
        fail("distill.dump_every", "must be >= 0 (0: never)")
    path = d.coach_model.path
    if d.coach == "llm" and path and _looks_local(path) and not Path(path).exists():
        fail("distill.coach_model.path", f"local path {path} does not exist")


_SECTION_CHECKS = {"inputs": _validate_inputs, "grader": _validate_grader, "student": _validate_student,
                   "teacher": _validate_teacher,
                   "inner": _validate_inner, "promotion": _validate_promotion, "loop": _validate_loop,
                   "resources": _validate_resources_section, "filter": _validate_filter, "rl": _validate_rl,
                   "distill": _validate_distill}

STAGE_SECTIONS = {
    "rl": ("inputs", "grader", "student", "rl", "distill"),
    "team": ("inputs", "grader", "student"),  # soar-team; team.* is checked by soar.team.checks.validate_team
    "filter": ("inputs", "grader", "filter"),
    # soar-train builds its hard set with fail@k (filter.*) unless loop.hard_set is a finished split.
    "train": ("inputs", "grader", "student", "teacher", "inner", "promotion", "loop", "resources", "filter"),
    "eval": ("grader", "student"),  # fresh students; eval.* is checked by soar.evaluate.validate_eval
    "world": (),
    "plan": ("student", "teacher", "inner"),  # soar-estimate --plan: no data, nothing run, any machine
    "plan_rl": ("student", "distill"),  # soar-estimate --plan --stage rl (and eval, filter)
    "plan_eval": ("student",),
    "plan_filter": ("filter",),
    "team_plan": ("student",),  # soar-estimate --plan of a soar-team config (team.* by soar.team.checks)
}
"""The config sections each stage reads, so each validates all of them (``inputs``: model + data;
``grader``: ``data.grader``)."""


def _validate_resources(r, model_path: str | None, cores: int) -> None:
    """The student pool must fit this machine: W workers x threads (+ engine threads) <= cores and
    W x (worker + 5 model copies: baseline, student, reference, Adam moments) + Ray <= available RAM."""
    for name in ("num_workers", "engine_threads"):
        if getattr(r, name) < 0:
            fail(f"resources.{name}", f"must be >= 0, got {getattr(r, name)}")
    if r.threads_per_worker < 1:
        fail("resources.threads_per_worker", f"must be >= 1, got {r.threads_per_worker}")
    if r.gpus_per_student < 0:
        fail("resources.gpus_per_student", f"must be >= 0, got {r.gpus_per_student}")
    if r.num_workers == 0 or r.ray_address is not None:
        return  # a cluster's capacity is Ray's to schedule
    threads = r.num_workers * r.threads_per_worker + r.engine_threads
    if threads > cores:
        fail("resources.num_workers", f"{r.num_workers} workers x {r.threads_per_worker} threads + "
                                       f"{r.engine_threads} engine threads = {threads} > {cores} cores; "
                                       f"at most {max((cores - r.engine_threads) // r.threads_per_worker, 0)} workers")
    per_worker = worker_ram_gb(model_path)
    available = machine.available_ram_gb()
    if available is not None and r.num_workers * per_worker + RAY_RAM_GB > available:
        fail("resources.num_workers", f"{r.num_workers} workers x {per_worker:.2f} GB + Ray {RAY_RAM_GB} GB "
                                       f"> {available:.1f} GB available; at most "
                                       f"{max(int((available - RAY_RAM_GB) // per_worker), 0)} workers")
    if r.gpus_per_student > 0:
        gpus = torch.cuda.device_count()
        if r.num_workers * r.gpus_per_student > gpus:
            fail("resources.gpus_per_student", f"{r.num_workers} workers x {r.gpus_per_student} GPUs > "
                                                f"{gpus} GPUs on this machine")


def _validate_policy(p, name: str) -> None:
    for key in ("max_steps", "max_tokens", "micro_batch_size"):
        if getattr(p, key) < 1:
            fail(f"{name}.{key}", f"must be >= 1, got {getattr(p, key)}")
    if p.lr <= 0:
        fail(f"{name}.lr", "must be > 0")
    if p.warmup_steps < 0 or p.warmup_steps >= p.max_steps and p.warmup_steps > 0:
        fail(f"{name}.warmup_steps", f"must be in [0, max_steps={p.max_steps})")
    if p.temperature <= 0:
        fail(f"{name}.temperature", "must be > 0 for sampling (greedy is used for evaluation)")
    if p.precision not in PRECISIONS:
        fail(f"{name}.precision", f"must be one of {', '.join(PRECISIONS)}, got {p.precision!r}")
    if p.loss_norm not in ("sequence", "token"):
        fail(f"{name}.loss_norm", f"must be sequence or token, got {p.loss_norm!r}")
    if p.kl_coef < 0:
        fail(f"{name}.kl_coef", "must be >= 0")
    if p.lora.r < 0:
        fail(f"{name}.lora.r", "must be >= 0 (0 = full fine-tuning)")


def _looks_local(path: str | None) -> bool:
    """Hub ids look like ``org/name``; anything absolute, relative-dotted or with a suffix is local."""
    if not path:
        return False
    p = str(path)
    return p.startswith(("/", ".", "~")) or p.endswith((".jsonl", ".json", ".parquet", ".gz", ".zip")) or p.count("/") >= 2
