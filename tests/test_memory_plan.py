"""The memory plan (``soar.memory_plan``, issues 49 §2 and 57 §1-2): every process and engine that shares a
GPU summed, for every stage that puts a model on a GPU, from the config and the models' shapes alone
(hand-written ``config.json`` files as published, built on the meta device: no hub, no weights). It refuses
the layouts issue 57 found approved but impossible, accepts every shipped GPU preset on the hardware its
comment names, runs before any stage's heavy work, and its activation count matches what autograd saves."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch

import soar
from soar.config import ConfigError
from soar.machine import ALLOC_CONF_ENV, EXPANDABLE_SEGMENTS, GIB
from soar.memory_plan import (
    activation_bytes,
    check_plan,
    model_shape,
    plan,
    policy_terms,
    vllm_memory_fraction,
)

from conftest import REPO, run_cli, script

pytestmark = pytest.mark.timeout(300)

DATA = Path(__file__).parent / "data"
LLAMA_3B, LLAMA_8B, LLAMA_70B, QWEN_32B = (DATA / name for name in ("llama3.2-3b", "llama3.1-8b", "llama3.3-70b",
                                                                    "qwen2.5-32b"))
"""Published config.json files (shape only): Llama-3.2-3B(-Instruct), Llama-3.1-8B-Instruct, Llama-3.3-70B-Instruct,
Qwen2.5-32B-Instruct."""
H100, H200 = "resources.gpu_memory_gb=79", "resources.gpu_memory_gb=139"

ISSUE_4X8_H100 = ["teacher.groups_per_step=2", "resources.num_workers=32", "resources.gpus_per_student=1",
                  "student.micro_batch_size=8", "teacher.micro_batch_size=8", "backend.batch_size=64", H100,
                  "resources.driver_gpu_apart=false", "resources.ray_address=null"]
"""The 4 x 8 H100 layout the plan used to approve: 32 workers, a GPU each, the driver's GPU among them."""
ISSUE_4X8_H100_APART = [*ISSUE_4X8_H100[:1], "resources.num_workers=31", *ISSUE_4X8_H100[2:7],
                        "resources.driver_gpu_apart=true", "resources.ray_address=auto"]
"""docs/paper_setting.md's former 4 x 8 H100 layout: the driver's GPU apart, 31 workers."""


def compose(*overrides: str):
    return soar.compose(list(overrides), config_name="train")


def paper(*overrides: str, experiment: str = "paper_math"):
    return compose(f"experiment={experiment}", f"model.path={LLAMA_3B}", *overrides)


@pytest.fixture(scope="module")
def shape():
    return model_shape(LLAMA_3B)


@pytest.fixture
def no_alloc_conf(monkeypatch):
    """The allocator's variables unset for the test and restored after it (as the user may have them)."""
    for name in (ALLOC_CONF_ENV, "PYTORCH_ALLOC_CONF", "SOAR_SET_ALLOC_CONF"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch


def test_shape_of_llama_3b_from_its_config(shape):
    assert shape.params == 3_212_749_824  # tied embeddings once
    assert (shape.layers, shape.hidden, shape.intermediate, shape.heads, shape.kv_heads, shape.head_dim) == \
        (28, 3072, 8192, 24, 8, 128)
    assert shape.linear_in_out["q_proj"] == (3072, 3072) and shape.linear_in_out["down_proj"] == (8192, 3072)
    assert shape.adapter_params(16, ["q_proj", "v_proj"]) == 28 * 16 * (3072 + 3072 + 3072 + 1024)


def test_mixed_precision_costs_16_bytes_per_parameter(shape):
    """fp32 master 4 + fp32 gradient 4 + AdamW moments 8, beside the bf16 weights: ~51 GB at 3.2 B."""
    cfg = paper()
    held, grads = policy_terms(shape, cfg.student, 2, "student")
    total = sum(t.bytes for t in held + grads) - 2 * shape.largest_param  # the bf16 grad in flight aside
    assert total == 16 * shape.params and 51e9 < total < 52e9
    held, grads = policy_terms(shape, paper("student.precision=pure").student, 2, "student")
    assert sum(t.bytes for t in held + grads) == 6 * shape.params


# ---- what issue 57 found: layouts the plan approved that cannot run, each refused or its preset fixed ----------
def test_the_driver_and_a_worker_on_one_gpu_are_summed(shape):
    """32 workers on 4 x 8 H100 with the driver's GPU in Ray's pool: each process fits a GPU alone (the old
    plan said "fits" for both), but GPU 0 holds both: refused, naming the GPU, both processes and the excess."""
    memory = plan(paper("backend=hf", *ISSUE_4X8_H100), shape)
    driver, worker = memory.role("driver"), memory.role("student worker")
    assert driver.needs_gib < 79 and worker.needs_gib < 79
    gpu0 = memory.gpus[0]
    assert gpu0.needs_gib == pytest.approx(driver.needs_gib + worker.needs_gib) and gpu0.needs_gib > 130
    assert memory.gpus[1].fits and memory.gpus[1].count == 31
    with pytest.raises(ConfigError) as err:
        check_plan(paper("backend=hf", *ISSUE_4X8_H100), shape)
    message = str(err.value)
    assert "GPU 0 (the driver's): driver" in message and "student worker" in message
    assert f"over by {gpu0.needs_gib - 79:.1f} GiB" in message and "each student worker GPU" not in message


def test_the_vllm_layout_is_refused_on_h100s(shape):
    """The 4 x 8 H100 layout with the driver's GPU apart: on hf a worker is 1.7 GiB over at micro-batch 8 (one
    trained student kept, the attention reserve) and fits at 4; with backend=vllm neither the driver's GPU (the
    teacher and its engine) nor a worker's (a full-FT student and its engine) fits."""
    with pytest.raises(ConfigError, match=r"each student worker GPU: student worker 80.7 .* over by 1.7"):
        check_plan(paper("backend=hf", *ISSUE_4X8_H100_APART), shape)
    apart = [*ISSUE_4X8_H100_APART, "student.micro_batch_size=4"]
    assert check_plan(paper("backend=hf", *apart), shape).fits
    memory = plan(paper("backend=vllm", *apart), shape)
    assert [gpu.fits for gpu in memory.gpus] == [False, False]
    with pytest.raises(ConfigError, match=r"GPU 0 \(the driver's\): driver .* \+ driver's vLLM engine"):
        check_plan(paper("backend=vllm", *apart), shape)


def test_band_rl_as_it_was_is_refused_and_as_shipped_fits(shape):
    """band_rl kept the schema's micro-batch of 64 without checkpointing: 884 GiB of activations at 3.6 k
    tokens. Shipped: micro-batch 4 with checkpointing, on one H100."""
    old = compose("experiment=band_rl", f"model.path={LLAMA_3B}", "student.micro_batch_size=64",
                  "student.gradient_checkpointing=false", "backend.batch_size=256", H100)
    with pytest.raises(ConfigError, match=r"student activations \(64 x 3584 tokens\) 883.5"):
        check_plan(old, shape, stage="rl")
    assert check_plan(compose("experiment=band_rl", f"model.path={LLAMA_3B}"), shape, stage="rl").fits


def distill(*overrides: str, experiment: str = "distill_math_8b", coach: Path = LLAMA_70B):
    return compose(f"experiment={experiment}", f"model.path={LLAMA_8B}", f"distill.coach_model.path={coach}",
                   *overrides)


def test_distill_math_8b_with_its_coach_loaded_by_hf_is_refused():
    """The 70B coach loaded with HF onto the policy's GPU (what make_coach did even when vLLM served it):
    ~131 GiB of weights. Served by vLLM only (soar.coach.make_coach, tests/test_distill.py), it fits."""
    with pytest.raises(ConfigError, match=r"coach model \(hf, .*llama3.3-70b\) 131"):
        check_plan(distill("backend.coach=hf"), stage="rl")
    memory = check_plan(distill(), stage="rl")
    assert memory.engines[0].name == "coach's vLLM engine" and memory.engines[0].model_path == str(LLAMA_70B)
    assert not any("coach model" in t.what for t in memory.role("soar-rl").held)


# ---- every shipped GPU preset fits the hardware its comment names ------------------------------------------------
def named_gpu_gib(experiment: str) -> float:
    """The GPU memory a preset plans with, and its comment names that hardware."""
    text = (REPO / "conf" / "experiment" / f"{experiment}.yaml").read_text()
    gib = compose(f"experiment={experiment}").resources.gpu_memory_gb
    assert gib in (79, 139), experiment
    assert ("H100 80GB" if gib == 79 else "H200 (141 GB") in text or experiment in ("paper_math", "paper_harp"), text
    return gib


@pytest.mark.parametrize("experiment", ["paper_math", "paper_harp", "paper_math_lora"])
@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_paper_presets_fit_their_hardware_on_hf_and_vllm(shape, experiment, backend):
    assert named_gpu_gib("paper") == 139 and "8 H200" in (REPO / "conf" / "experiment" / "paper.yaml").read_text()
    memory = check_plan(paper(f"backend={backend}", experiment=experiment), shape)
    assert memory.gpus[0].capacity_gib == 139 and all(gpu.fits for gpu in memory.gpus)
    for stage in ("filter", "eval"):
        check_plan(paper(f"backend={backend}", experiment=experiment), shape, stage=stage)


def test_the_lora_layout_needs_h200s(shape):
    """GPU 0 of experiment=paper_math_lora holds the teacher, a student worker and two engines: on H100s the
    engines get less than their weights, overhead and KV cache."""
    with pytest.raises(ConfigError, match=r"GPU 0 \(the driver's\)"):
        check_plan(paper("backend=vllm", H100, experiment="paper_math_lora"), shape)


def test_the_rl_presets_fit_their_hardware():
    assert named_gpu_gib("band_rl") == 79
    check_plan(compose("experiment=band_rl", f"model.path={LLAMA_3B}"), stage="rl")
    check_plan(compose("experiment=band_rl", f"model.path={LLAMA_3B}"), stage="filter")
    for experiment, coach in (("distill_math_8b", LLAMA_70B), ("distill_math_8b_coach32b", QWEN_32B)):
        named_gpu_gib(experiment)
        memory = check_plan(distill(experiment=experiment, coach=coach), stage="rl")
        tp = compose(f"experiment={experiment}").backend.vllm.tensor_parallel_size
        assert memory.gpus[-1].label == f"GPUs 1-{tp - 1} (engine shards)" and tp <= 8  # one 8-GPU node


def test_a_local_pool_cannot_keep_the_drivers_gpu_apart(tmp_path):
    """A local Ray pool gets every GPU, the driver's included: a config that plans with the driver's GPU apart
    must run on a cluster that keeps it out (slurm/soar.sbatch with SOAR_DRIVER_GPUS)."""
    data = tmp_path / "q.jsonl"
    data.write_text('{"id": "a", "question": "1+1", "answer": "2"}\n')
    local = ("resources.ray_address=null", "resources.num_workers=1", "resources.gpus_per_student=0", "data=custom",
             f"data.path={data}")
    with pytest.raises(ConfigError, match="resources.driver_gpu_apart: a local Ray pool"):
        soar.validate(paper(*local), "train")
    soar.validate(paper(*local, "resources.driver_gpu_apart=false"), "train")  # the same pool sharing GPU 0: valid


# ---- engines: sized from what their GPU leaves, and started with no more --------------------------------------
def test_vllm_share_is_sized_from_free_memory_and_training_still_to_come():
    total = 80 * GIB
    # 70 GiB free, training peaks at 40 GiB of which 10 are held already: 70 - 30 - 2 (margin) = 38
    assert vllm_memory_fraction(total, 70 * GIB, 10 * GIB, 40 * GIB) == pytest.approx(38 / 80)
    assert vllm_memory_fraction(total, 20 * GIB, 0, 40 * GIB) == 0.0  # no room: 0 (refused by the caller)


def test_engines_share_what_their_gpu_leaves(shape):
    """Null ``gpu_memory_utilization``: the engines on a GPU split what its processes leave, less the margin
    (GPU 0 of the LoRA layout: the driver's and a worker's); a given share is used as given."""
    memory = plan(paper("backend=vllm", experiment="paper_math_lora"), shape)
    gpu0 = memory.gpus[0]
    left = 139 - sum(n * role.needs_gib for role, n in gpu0.processes) - 2
    assert [e.name for e in gpu0.engines] == ["driver's vLLM engine", "worker's vLLM engine"]
    assert all(e.budget_bytes / GIB == pytest.approx(left / 2, abs=0.01) for e in gpu0.engines)
    assert gpu0.needs_gib == pytest.approx(139 - 2, abs=0.01)
    given = plan(paper("backend=vllm", "backend.vllm.gpu_memory_utilization=0.3", experiment="paper_math_lora"), shape)
    assert {e.budget_bytes for e in given.engines} == {int(0.3 * 139 * GIB)} and not given.gpus[0].fits


def test_engine_start_on_a_gpu_uses_the_rule(monkeypatch):
    """``soar.vllm_backend.gpu_memory_utilization`` with the GPU's numbers passed in (no GPU here): free memory
    less training still to come, capped at the plan's budget for the engine."""
    from soar.config import VLLMConfig
    from soar.vllm_backend import gpu_memory_utilization

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (60 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 20 * GIB)
    assert gpu_memory_utilization(VLLMConfig(), 50 * GIB) == pytest.approx((60 - 30 - 2) / 80)
    assert gpu_memory_utilization(VLLMConfig(), 50 * GIB, 10 * GIB) == pytest.approx(10 / 80)  # another process's part
    assert gpu_memory_utilization(VLLMConfig(gpu_memory_utilization=0.3), 50 * GIB) == 0.3  # as given
    with pytest.raises(ConfigError, match="backend.vllm.gpu_memory_utilization"):
        gpu_memory_utilization(VLLMConfig(), 78 * GIB)


def test_an_engine_starts_without_the_allocator_setting_soar_gave_its_process(no_alloc_conf):
    from soar.machine import engine_environment, use_expandable_segments

    monkeypatch = no_alloc_conf
    assert use_expandable_segments() and os.environ[ALLOC_CONF_ENV] == EXPANDABLE_SEGMENTS
    with engine_environment():
        assert ALLOC_CONF_ENV not in os.environ
    assert os.environ[ALLOC_CONF_ENV] == EXPANDABLE_SEGMENTS
    monkeypatch.setenv(ALLOC_CONF_ENV, "max_split_size_mb:128")  # the user's: kept, everywhere
    monkeypatch.delenv("SOAR_SET_ALLOC_CONF")
    assert not use_expandable_segments()
    with engine_environment():
        assert os.environ[ALLOC_CONF_ENV] == "max_split_size_mb:128"


# ---- every GPU stage runs the plan before its heavy work -----------------------------------------------------------
@pytest.mark.parametrize("stage", ["train", "rl", "eval", "filter"])
def test_every_gpu_stage_runs_the_plan_first(tmp_path, no_alloc_conf, stage):
    """On a GPU (``model.device=cuda``) each stage refuses a layout that does not fit (here: a 3B model on a
    4 GiB GPU) before it loads anything or writes its run dir, having set expandable segments."""
    from soar.stage import setup_stage

    data = tmp_path / "q.jsonl"
    data.write_text('{"id": "a", "question": "1+1", "answer": "2"}\n')
    cfg = paper("model.device=cuda", "data=custom", f"data.path={data}", f"run.dir={tmp_path / 'run'}",
                "resources.gpu_memory_gb=4", "resources.num_workers=0", "resources.ray_address=null",
                "resources.driver_gpu_apart=false")
    with pytest.raises(ConfigError, match=f"the {stage} stage's memory plan does not fit"):
        setup_stage(cfg, stage)
    assert not (tmp_path / "run").exists()
    assert os.environ[ALLOC_CONF_ENV] == EXPANDABLE_SEGMENTS


def test_soar_estimate_plan_prints_each_gpu():
    res = run_cli([script("soar-estimate"), "--plan", "experiment=paper_math", f"model.path={LLAMA_3B}"],
                  cwd=REPO, timeout=240)
    assert "| GPU 0 (the driver's) | driver" in res.stdout and "| each student worker GPU (x7) |" in res.stdout
    res = run_cli([script("soar-estimate"), "--plan", "--stage", "rl", "experiment=band_rl", f"model.path={LLAMA_3B}"],
                  cwd=REPO, timeout=240)
    assert "| GPU 0 (soar-rl) | soar-rl" in res.stdout and "fits" in res.stdout
    refused = run_cli([script("soar-estimate"), "--plan", "experiment=paper_math", f"model.path={LLAMA_3B}",
                       *ISSUE_4X8_H100], cwd=REPO, timeout=240, check=False)
    assert refused.returncode == 2 and "over by" in refused.stderr and "GPU 0 (the driver's)" in refused.stderr


def saved_activation_bytes(model, ids, attn) -> int:
    """Bytes of the tensors autograd saves in a decoder forward, parameters aside, each storage once."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        base.get_decoder()(input_ids=ids, attention_mask=attn, use_cache=False)
    return sum(seen.values())


@pytest.mark.parametrize("kind", ["full", "lora_bf16_adapters", "lora_fp32_adapters", "checkpointing"])
def test_activation_count_matches_what_autograd_saves(kind):
    """The plan's activations against the tensors transformers' Llama saves in bf16 on CPU (a padded
    micro-batch of 4 x 96): within [1, 1.35] x measured (with fp32 adapters: +26 h per token and layer
    measured, the plan counts every adapted input: +34); with checkpointing, the forward keeps the
    layer inputs only and the plan adds one layer's recompute."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=256, intermediate_size=688, num_attention_heads=8, num_key_value_heads=2,
                         num_hidden_layers=2, vocab_size=512, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    fp32_inputs = 0
    if kind.startswith("lora"):
        fp32 = kind == "lora_fp32_adapters"
        model = get_peft_model(model, LoraConfig(r=8, target_modules=targets), autocast_adapter_dtype=fp32)
        fp32_inputs = model_shape(config).adapted_inputs(targets) if fp32 else 0
    if kind == "checkpointing":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids = torch.randint(0, 512, (4, 96), generator=torch.Generator().manual_seed(0))
    attn = torch.ones_like(ids)
    attn[1, 60:] = 0  # padding: the SDPA mask path (repeated k/v, a mask per layer)
    measured = saved_activation_bytes(model, ids, attn)
    shape = model_shape(copy.deepcopy(config))
    planned = activation_bytes(shape, 2, 4, 96, kind == "checkpointing", fp32_inputs)
    if kind == "checkpointing":
        one_layer = activation_bytes(shape, 2, 4, 96) - activation_bytes(shape, 2, 4, 96, True) + \
            4 * 96 * 2 * shape.hidden * (shape.layers - 1)
        assert measured <= planned and planned - one_layer <= 1.35 * measured, (measured, planned, one_layer)
    else:
        assert measured <= planned <= 1.35 * measured, (measured, planned)
