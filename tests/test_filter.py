"""soar-filter: bands, hard split, provenance, resume after SIGKILL, and the pure helpers."""

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from soar.data import shared_data_dir
from soar.filters.failk import band, prob_group_mixed, split_hard

from conftest import arith_data, run_cli, script, write_jsonl

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def filter_questions(tmp_path_factory):
    """Easy 3-digit no-carry sums the tiny model often solves, and 4-digit sums it never saw."""
    from soar.worlds.arith import generate_problems

    easy = generate_problems(3, 0, 6, seed=11, prefix="easy")
    hard = generate_problems(4, 2, 6, seed=12, prefix="hard")
    return write_jsonl(tmp_path_factory.mktemp("filter") / "questions.jsonl", easy + hard)


def filter_args(model, data, run_dir, k=16, extra=()):
    return [script("soar-filter"), f"model={model}", *arith_data(data), f"filter.k={k}",
            "filter.max_tokens=24", "backend=hf", "run.threads=1", "run.progress=false", f"run.dir={run_dir}", *extra]


def manifest_rows(run_dir):
    return [json.loads(line) for line in (run_dir / "manifest.jsonl").read_text().splitlines()]


def test_filter_builds_hard_set(tiny_model_dir, filter_questions, tmp_path):
    import datasets

    run_cli(filter_args(tiny_model_dir, filter_questions, tmp_path / "f"))
    summary = json.loads((tmp_path / "f" / "summary.json").read_text())
    assert summary["problems"] == 12 and sum(summary["bands"].values()) == 12
    rows = {r["id"]: r for r in manifest_rows(tmp_path / "f")}
    assert all(rows[f"hard/c2/{i}"]["passes"] == 0 for i in range(6))  # never seen 4-digit sums
    assert sum(rows[f"easy/c0/{i}"]["passes"] for i in range(6)) > 0
    assert all(len(r["outcomes"]) == 16 and r["passes"] == sum(r["outcomes"]) for r in rows.values())
    assert {"model", "template_sha", "sampling", "seed", "k"} <= set(next(iter(rows.values())))
    hard = summary["hard"]
    assert hard == summary["bands"]["all_zero"] >= 6 and summary["hard_train"] + summary["hard_test"] == hard
    ds = datasets.load_from_disk(str(tmp_path / "f" / "hard_set"))
    assert len(ds["train"]) == summary["hard_train"] and len(ds["test"]) == summary["hard_test"]
    train_ids = [json.loads(line)["id"] for line in (tmp_path / "f" / "hard_train.jsonl").read_text().splitlines()]
    assert sorted(train_ids) == sorted(ds["train"]["id"])
    assert json.loads(ds["train"][0]["provenance"])["k"] == 16
    assert set(summary["mixed_prob_group_mixed"]) == {"8", "32"}


@pytest.mark.slow
def test_filter_resume_after_kill(tiny_model_dir, filter_questions, tmp_path):
    extra = ["filter.problems_per_batch=1"]
    run_cli(filter_args(tiny_model_dir, filter_questions, tmp_path / "ref", extra=extra))
    killed = tmp_path / "killed"
    proc = subprocess.Popen(filter_args(tiny_model_dir, filter_questions, killed, extra=extra),
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    manifest = killed / "manifest.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and not (manifest.exists() and len(manifest.read_text().splitlines()) >= 3):
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    n_before = len(manifest.read_text().splitlines())
    assert 3 <= n_before < 12, n_before
    with open(manifest, "a") as fh:  # simulate a row cut mid-write by the kill
        fh.write('{"id": "easy/c0/')
    run_cli(filter_args(tiny_model_dir, filter_questions, killed, extra=extra))
    resumed, reference = manifest_rows(killed), manifest_rows(tmp_path / "ref")
    assert len({r["id"] for r in resumed}) == len(resumed) == 12  # nothing redone twice, nothing lost
    assert sorted(resumed, key=lambda r: r["id"]) == sorted(reference, key=lambda r: r["id"])
    ids = lambda d: [json.loads(x)["id"] for x in (d / "hard_train.jsonl").read_text().splitlines()]  # noqa: E731
    assert ids(killed) == ids(tmp_path / "ref")


def test_filter_refuses_changed_settings_on_resume(tiny_model_dir, filter_questions, tmp_path):
    run_cli(filter_args(tiny_model_dir, filter_questions, tmp_path / "f", k=4))
    res = run_cli(filter_args(tiny_model_dir, filter_questions, tmp_path / "f", k=8), check=False)
    assert res.returncode == 2 and "other settings (1 differ: filter.k 4 -> 8)" in res.stderr  # the run dir's contract


def test_filter_rejects_prompt_plus_budget_over_context(tiny_model_dir, filter_questions, tmp_path):
    res = run_cli(filter_args(tiny_model_dir, filter_questions, tmp_path / "f", extra=["filter.max_tokens=5000"]),
                  check=False)
    assert res.returncode == 2 and "filter.max_tokens" in res.stderr and "model context (2048)" in res.stderr


def test_bands_and_mixed_probability():
    assert [band(0, 8), band(3, 8), band(8, 8)] == ["all_zero", "mixed", "all_one"]
    assert prob_group_mixed(0.5, 2) == pytest.approx(0.5)
    assert prob_group_mixed(0.1, 8) == pytest.approx(1 - 0.1 ** 8 - 0.9 ** 8)
    assert prob_group_mixed(0.0, 32) == 0.0


def test_split_is_deterministic_and_order_free():
    ids = [f"p{i}" for i in range(101)]
    train, test = split_hard(ids, 0.5, seed=3)
    assert len(test) == 50 and len(train) == 51 and not set(train) & set(test)
    assert split_hard(list(reversed(ids)), 0.5, seed=3) == (train, test)
    assert split_hard(ids, 0.5, seed=4) != (train, test)


def test_filter_writes_bands_with_heldout_per_source(tiny_model_dir, tmp_path):
    """Every band's problems with their pass counts and P(mixed group at G), a held-out split per source,
    and the hard set as without it (all of the 0/k problems, held-out ones included)."""
    import datasets

    from soar.worlds.arith import generate_problems

    groups = {"easy": generate_problems(3, 0, 6, seed=11, prefix="easy"),  # often solved
              "mid": generate_problems(3, 2, 6, seed=13, prefix="mid"),  # sometimes
              "hard": generate_problems(4, 2, 6, seed=12, prefix="hard")}  # never seen
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps({"id": p.id, "question": p.question, "answer": p.answer, "source": src}) + "\n"
                            for src, probs in groups.items() for p in probs))
    run_dir = tmp_path / "f"
    run_cli(filter_args(tiny_model_dir, pool, run_dir, extra=["data.source_key=source", "filter.heldout_per_source=2",
                                                              "student.group_size=4"]))
    manifest = {r["id"]: r for r in manifest_rows(run_dir)}
    bands = {name: [json.loads(line) for line in (run_dir / "bands" / f"{name}.jsonl").read_text().splitlines()]
             for name in ("all_zero", "mixed", "all_one", "heldout")}
    held = bands["heldout"]
    assert sorted(r["source"] for r in held) == ["easy", "easy", "hard", "hard", "mid", "mid"]
    ids = [r["id"] for rows in bands.values() for r in rows]
    assert sorted(ids) == sorted(manifest) and len(set(ids)) == 18  # each problem once
    for name, rows in bands.items():
        for r in rows:
            passes = manifest[r["id"]]["passes"]
            assert r["passes"] == passes and r["k"] == 16 and r["band"] == band(passes, 16)
            assert name in ("heldout", r["band"])
            assert r["group_size"] == 4 and r["prob_group_mixed"] == pytest.approx(prob_group_mixed(passes / 16, 4))
            assert json.loads(r["provenance"])["k"] == 16 and set(r) >= {"question", "answer", "meta"}
    assert bands["mixed"] and bands["all_zero"]  # the pool spans the bands
    summary = json.loads((run_dir / "summary.json").read_text())
    files = summary["band_files"]
    assert files["heldout_by_source"] == {"easy": 2, "hard": 2, "mid": 2} and files["group_size"] == 4
    assert {n: files[n]["problems"] for n in bands} == {n: len(rows) for n, rows in bands.items()}
    assert files["mixed"]["prob_group_mixed_mean"] == pytest.approx(np.mean([r["prob_group_mixed"] for r in bands["mixed"]]))
    # the hard set is all of the 0/k problems, held-out ones included, split as before
    hard = {s: [json.loads(line)["id"] for line in (run_dir / f"hard_{s}.jsonl").read_text().splitlines()]
            for s in ("train", "test")}
    zero = sorted(i for i, r in manifest.items() if r["passes"] == 0)
    assert (sorted(hard["train"]), sorted(hard["test"])) == split_hard(zero, 0.5, 0)
    ds = datasets.load_from_disk(str(run_dir / "bands" / "dataset"))
    assert {k: len(v) for k, v in ds.items()} == {n: len(rows) for n, rows in bands.items() if rows}
    assert ds["heldout"].features["passes"].dtype == "int64"


def test_heldout_draw_is_per_source_and_order_free():
    from soar.data import Problem
    from soar.filters.failk import heldout_ids

    probs = [Problem(f"{s}/{i}", "q", "1", s) for s in ("a", "b") for i in range(10)] + [Problem("c/0", "q", "1", "c")]
    held = heldout_ids(probs, 3, seed=0)
    assert [sum(i.startswith(s) for i in held) for s in "abc"] == [3, 3, 1]  # a smaller source: all of it
    assert sorted(heldout_ids(list(reversed(probs)), 3, seed=0)) == sorted(held)
    assert heldout_ids(probs, 3, seed=1) != held
    # proportional: a fifth of each source, so a small source keeps most of its problems in training
    big = [Problem(f"o/{i}", "q", "1", "o") for i in range(675)] + [Problem(f"s/{i}", "q", "1", "s") for i in range(30)]
    by_frac = heldout_ids(big, 0, seed=0, frac=0.2)
    assert [sum(i.startswith(s) for i in by_frac) for s in "os"] == [135, 6]
    assert sorted(heldout_ids(list(reversed(big)), 0, seed=0, frac=0.2)) == sorted(by_frac)
    assert set(by_frac) < set(heldout_ids(big, 0, seed=0, frac=0.3))  # a larger fraction extends the same draw


def test_heldout_frac_that_rounds_to_nothing_warns(caplog):
    from soar.data import Problem
    from soar.filters.failk import heldout_ids

    probs = [Problem(f"o/{i}", "q", "1", "o") for i in range(50)] + [Problem(f"s/{i}", "q", "1", "s") for i in range(2)]
    with caplog.at_level("WARNING", logger="soar.filters"):
        held = heldout_ids(probs, 0, seed=0, frac=0.2)
    assert len(held) == 10 and not any(i.startswith("s/") for i in held)
    assert "'s' has 2 problems, none held out (filter.heldout_frac=0.2 rounds to 0)" in caplog.text


@pytest.mark.skipif(not (shared_data_dir() / "NOTICE.md").exists(), reason="benchmark files not found (SOAR_DATA_DIR)")
def test_pool_of_data_configs_keeps_each_source(tmp_path):
    """filter.pool: several benchmarks' data configs as one pool with a source column, ids prefixed by source,
    read back with data.source_key; the held-out draw takes 25 per source."""
    import soar
    from soar.filters.failk import filter_problems, heldout_ids

    cfg = soar.compose(["experiment=band_rl", "filter.pool=[aime24,amc23]"])
    problems = filter_problems(cfg, tmp_path)
    assert [sum(p.source == s for p in problems) for s in ("aime24", "amc23")] == [30, 40]
    assert len({p.id for p in problems}) == 70 and problems[0].id == "aime24/60" and problems[0].answer == "204"
    rows = [json.loads(line) for line in (tmp_path / "pool.jsonl").read_text().splitlines()]
    assert rows[-1]["source"] == "amc23" and rows[-1]["id"].startswith("amc23/")
    held = heldout_ids(problems, cfg.filter.heldout_per_source, cfg.seed, cfg.filter.heldout_frac)
    assert [sum(i.startswith(s) for i in held) for s in ("aime24", "amc23")] == [6, 8]  # a fifth of each
