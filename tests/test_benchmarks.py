"""Benchmark data configs on the real files in ../shared/data (read in place), their real defects,
the paper presets, and bringing your own hard set (loop.hard_set = JSONL / manifest / folder)."""

import json
import logging

import pytest

import soar
from soar.config import ConfigError, DataConfig
from soar.data import DataError, load_problems, shared_data_dir
from soar.filters.failk import UNRECORDED_SPLIT_SEED, split_hard
from soar.prepare import given_hard_set
from soar.validation import validate

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not (shared_data_dir() / "NOTICE.md").exists(),
                                 reason=f"benchmark files not found in {shared_data_dir()} (set SOAR_DATA_DIR)")]

# config -> (problems, first id, first answer): counts from ../shared/data/NOTICE.md
EXPECTED = {
    "math": (5000, "test/algebra/1.json", "2"),
    "math_train": (7498, "train/algebra/0.json", "0"),  # 7500 rows less the two empty \boxed{}
    "math500": (500, "test/precalculus/807.json", r"\left( 3, \frac{\pi}{2} \right)"),
    "harp": (4780, "1950/AHSME/1", r"10\frac{2}{3}"),
    "olympiadbench": (674, "1606", "2"),  # 675 rows less id 1965
    "aime24": (30, "60", "204"),
    "amc23": (40, "0", "27"),  # 27.0 in the file
}
_loaded: dict[str, list] = {}


def load(name: str, *overrides: str) -> list:
    """Problems of ``data=<name>`` composed as a user would (cached per test session)."""
    key = "|".join((name, *overrides))
    if key not in _loaded:
        _loaded[key] = load_problems(soar.compose([f"data={name}", *overrides]).data)
    return _loaded[key]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_benchmark_config_loads_into_one_schema(name):
    problems = load(name)
    count, first_id, first_answer = EXPECTED[name]
    assert len(problems) == count and len({p.id for p in problems}) == count
    assert (problems[0].id, problems[0].answer) == (first_id, first_answer)
    assert all(p.question and p.answer and p.source == name for p in problems)
    assert not any(p.answer.startswith("$") or p.answer.endswith("$") for p in problems)
    if name in ("math", "math_train", "math500", "harp", "olympiadbench"):
        assert all(isinstance(p.meta["subject"], str) and p.meta["subject"] for p in problems)
    if name in ("math", "math500", "harp"):
        assert all(p.meta["level"] in range(1, 7) for p in problems)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_stage_accepts_the_benchmark_config(name, tmp_path):
    from soar.cli import rewrite_shortcuts

    assert rewrite_shortcuts([f"data={name}"]) == [f"data={name}"]  # a config name, not a file path
    cfg = soar.compose([f"data={name}", "data.limit=3", f"model.path={tmp_path}"])
    assert cfg.data.path.startswith(str(shared_data_dir())) and cfg.data.grader == "math_verify"
    for stage in ("filter", "rl", "train"):
        validate(cfg, stage)
    assert len(load_problems(cfg.data)) == 3


def test_data_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SOAR_DATA_DIR", str(tmp_path))
    assert soar.compose(["data=math500"]).data.path == f"{tmp_path}/math500/test.jsonl"
    with pytest.raises(ConfigError, match=f"data.path: file {tmp_path}/math500/test.jsonl does not exist"):
        validate(soar.compose(["data=math500", "model.path=/tmp"]), "filter")


def test_math_train_empty_boxed_rows_are_bad_rows_and_null_levels_load(caplog):
    with caplog.at_level(logging.WARNING, logger="soar.data"):
        problems = load_problems(soar.compose(["data=math_train"]).data)
    train = str(shared_data_dir() / "math" / "train.jsonl.gz")
    for row, pid in ((5529, "train/number_theory/7115.json"), (5531, "train/number_theory/7117.json")):
        assert f"{train}: row {row}: field 'answer' is missing or empty (id '{pid}')" in caplog.text
    assert not {"train/number_theory/7115.json", "train/number_theory/7117.json"} & {p.id for p in problems}
    null_level = {p.id: p for p in problems if p.meta["level"] is None}
    assert sorted(null_level) == ["train/geometry/377.json", "train/geometry/471.json"]
    assert [p.answer for p in null_level.values()] == ["52", "24"]
    with pytest.raises(DataError, match=r"train\.jsonl\.gz: row 5529: field 'answer' is missing or empty "
                                        r"\(id 'train/number_theory/7115\.json'\)"):
        load_problems(soar.compose(["data=math_train", "data.on_bad_row=error"]).data)


def test_olympiadbench_excludes_1965_and_unwraps_final_answer_lists():
    by_id = {p.id: p for p in load("olympiadbench")}
    assert "1965" not in by_id
    assert by_id["1664"].answer == "69,84"  # ["$69$,$84$"]
    assert by_id["1606"].meta["subject"] == "Combinatorics" and isinstance(by_id["1606"].meta["solution"], list)
    everything = {p.id for p in load("olympiadbench", "data.exclude_ids=[]")}
    assert len(everything) == 675 and "1965" in everything


def test_amc23_float_answers_and_aime24_padded_answers():
    assert [p.answer for p in load("amc23")][:4] == ["27", "36", "45", "3159"]
    aime = {p.id: p.answer for p in load("aime24")}
    assert sum(a.startswith("0") for a in aime.values()) == 7 and "025" in aime.values()  # kept verbatim


def test_harp_is_streamed_from_its_zip_without_extracting(monkeypatch, tmp_path):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    monkeypatch.setattr(datasets.config, "DOWNLOADED_DATASETS_PATH", tmp_path / "cache" / "downloads")
    monkeypatch.setattr(datasets.config, "EXTRACTED_DATASETS_PATH", tmp_path / "cache" / "downloads" / "extracted")
    problems = load_problems(soar.compose(["data=harp", "data.limit=5"]).data)
    assert [p.id for p in problems] == ["1950/AHSME/1", "1950/AHSME/2", "1950/AHSME/4", "1950/AHSME/5", "1950/AHSME/6"]
    big = [f for f in tmp_path.rglob("*") if f.is_file() and f.stat().st_size > 100_000]
    assert not big, f"HARP was copied out of its zip: {big}"
    cfg = soar.compose(["data=harp", "data.member=nope.jsonl"]).data
    with pytest.raises(DataError, match=r"HARP\.jsonl\.zip: no member 'nope\.jsonl' "
                                        r"\(members: \['HARD-Math\.jsonl'\]\)"):
        load_problems(cfg)


# ----------------------------------------------------------------- generic loader: bad rows, formats
def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_normalisers_lists_templates_and_bad_rows_are_named(tmp_path, caplog):
    path = write_jsonl(tmp_path / "q.jsonl", [
        {"y": 2001, "n": 1, "q": "a", "a": ["$\\frac12$"]},
        {"y": 2001, "n": 2, "q": "b", "a": ["1", "2"]},       # two answers
        {"y": 2001, "q": "c", "a": "3"},                       # no n for the id template
        {"y": 2001, "n": 4, "q": "d", "a": "$$"},              # empty once $ are stripped
        {"y": 2001, "n": 5, "q": "e", "a": "\\$5"},            # an escaped dollar is text
    ])
    cfg = DataConfig(name="t", path=str(path), problem_key="q", answer_key="a", id_template="{y}/{n}",
                     answer_normalizers=["strip_dollars"], meta_columns={"year": "y"})
    with caplog.at_level(logging.WARNING, logger="soar.data"):
        problems = load_problems(cfg)
    assert [(p.id, p.answer, p.meta) for p in problems] == [("2001/1", "\\frac12", {"year": 2001}),
                                                           ("2001/5", "\\$5", {"year": 2001})]
    for message in (f"{path}: row 1: field 'a' holds 2 values (expected one) (id '2001/2')",
                    f"{path}: row 2: field 'n' (in data.id_template) is missing or empty",
                    f"{path}: row 3: field 'a' is missing or empty (id '2001/4')"):
        assert message in caplog.text
    with pytest.raises(DataError, match="data.answer_normalizers: unknown \\['lower'\\]"):
        load_problems(DataConfig(name="t", path=str(path), answer_normalizers=["lower"]))
    with pytest.raises(DataError, match="data.meta_columns: no column 'yaer'"):
        load_problems(DataConfig(name="t", path=str(path), problem_key="q", answer_key="a", meta_columns={"year": "yaer"}))


def test_custom_datasetdict_folder_reads_the_configured_split(tmp_path):
    import datasets

    rows = {s: [{"id": f"{s}{i}", "question": f"{i}+{i}", "answer": str(2 * i)} for i in range(3)]
            for s in ("train", "test")}
    datasets.DatasetDict({s: datasets.Dataset.from_list(r) for s, r in rows.items()}).save_to_disk(str(tmp_path / "dd"))
    cfg = soar.compose(["data=custom", f"data.path={tmp_path / 'dd'}", "data.split=test"]).data
    assert [p.id for p in load_problems(cfg)] == ["test0", "test1", "test2"]


# ------------------------------------------------------------------------------------- paper presets
@pytest.mark.parametrize("preset,data_name,pool,mixing", [("paper_math", "math", 5000, "curriculum"),
                                                          ("paper_harp", "harp", 4780, "mixed")])
def test_paper_presets_pin_table_3(preset, data_name, pool, mixing):
    from soar.default_prompts import PAPER_STUDENT_TEMPLATE
    from soar.teachers.prompts import PAPER_TEACHER_PROMPT

    cfg = soar.compose([f"experiment={preset}", "data.limit=4"])
    assert cfg.model.path == "meta-llama/Llama-3.2-3B-Instruct" and cfg.run.name == f"{preset}_s0"
    assert (cfg.data.name, cfg.data.grader, cfg.data.prompt_template) == (data_name, "math_verify",
                                                                          PAPER_STUDENT_TEMPLATE)
    f, s, t, inner, promo = cfg.filter, cfg.student, cfg.teacher, cfg.inner, cfg.promotion
    assert (f.k, f.temperature, f.max_tokens, f.test_frac) == (128, 1.0, 1024, 0.5)
    assert (s.questions_per_step, s.group_size, s.lr, s.kl_coef, s.temperature, s.max_tokens, s.max_steps,
            s.warmup_steps, s.lora.r) == (8, 32, 1e-5, 0.001, 1.0, 1024, 10, 0, 0)
    assert (t.prompt, t.datasets, t.questions_per_dataset, t.lr, t.warmup_steps, t.kl_coef, t.temperature,
            t.max_tokens, t.max_steps) == (PAPER_TEACHER_PROMPT, 4, 64, 1e-5, 20, 0.001, 1.0, 512, 200)
    assert (inner.replicates, inner.reward_questions, inner.steps_per_promotion, inner.max_steps) == (4, 64, 5, 20)
    assert (promo.enabled, promo.tau, promo.window, cfg.loop.steps) == (True, 0.01, 3, 200)
    assert (cfg.eval.mixing, cfg.eval.curriculum_steps, cfg.eval.steps, cfg.eval.warmup_steps) == (mixing, 64, 1500, 20)
    for stage in ("filter", "train"):
        validate(cfg, stage)
    assert len(load_problems(cfg.data)) == 4
    assert len(load(data_name)) == pool  # the whole pool without data.limit


# ------------------------------------------------------------------------------ bring your own hard set
def hard_cfg(hard_set, *extra):
    return soar.compose(["experiment=paper_math", f"loop.hard_set={hard_set}", *extra])


def test_hard_set_from_a_jsonl_is_split_like_soar_filter(tmp_path):
    rows = [{"id": f"q{i}", "question": f"{i}+{i}", "answer": str(2 * i)} for i in range(10)]
    cfg = hard_cfg(write_jsonl(tmp_path / "mine.jsonl", rows), "seed=3")
    train, test, _ = given_hard_set(cfg, tmp_path / "run")
    expected_train, expected_test = split_hard([r["id"] for r in rows], 0.5, UNRECORDED_SPLIT_SEED)
    assert [p.id for p in train] == expected_train and [p.id for p in test] == expected_test and len(test) == 5
    written = [json.loads(line)["id"] for line in (tmp_path / "run/hard_set/hard_train.jsonl").read_text().splitlines()]
    assert written == expected_train  # the split used is on record in the run dir
    # the hard set's split, not the run's: another seed gets the same one
    assert [p.id for p in given_hard_set(hard_cfg(tmp_path / "mine.jsonl", "seed=4"))[0]] == expected_train


def test_hard_set_from_a_jsonl_with_a_split_column(tmp_path):
    rows = [{"id": f"q{i}", "question": f"{i}+1", "answer": str(i + 1), "split": "test" if i < 2 else "train"}
            for i in range(5)]
    train, test, _ = given_hard_set(hard_cfg(write_jsonl(tmp_path / "s.jsonl", rows)))
    assert [p.id for p in test] == ["q0", "q1"] and [p.id for p in train] == ["q2", "q3", "q4"]
    rows[3]["split"] = "dev"
    with pytest.raises(ConfigError, match="loop.hard_set: .*s.jsonl: field 'split' of id 'q3' is 'dev'"):
        given_hard_set(hard_cfg(write_jsonl(tmp_path / "s.jsonl", rows)))


def test_hard_set_from_a_failk_manifest_takes_problems_from_data(tmp_path):
    pool = load("math500", "data.limit=12")
    rows = [{"id": p.id, "batch": i // 2, "outcomes": [0, 0] if i % 3 else [0, 1], "passes": 0 if i % 3 else 1}
            for i, p in enumerate(pool)]
    (tmp_path / "fk").mkdir()
    manifest = write_jsonl(tmp_path / "fk" / "manifest.jsonl", rows)
    manifest.write_text(manifest.read_text() + '{"id": "cut by a ki')  # a killed filter's last line
    hard_ids = [r["id"] for r in rows if r["passes"] == 0]
    for given in (manifest, tmp_path / "fk"):  # the file, or a filter run dir that has no hard_*.jsonl yet
        train, test, _ = given_hard_set(hard_cfg(given, "data=math500", "data.limit=12"))
        assert ([p.id for p in train], [p.id for p in test]) == split_hard(hard_ids, 0.5, 0)
        assert all(p.question and p.meta["subject"] for p in train + test)
    with pytest.raises(ConfigError, match=r"loop.hard_set: 8 ids of .*manifest.jsonl are not in data"):
        given_hard_set(hard_cfg(manifest, "data=math500", "data.limit=1"))


def test_hard_set_folder_is_read_in_the_record_schema_whatever_data_keys(tmp_path):
    """A soar-filter hard set has question/answer columns; data=math maps problem/answer."""
    (tmp_path / "hs").mkdir()
    for split in ("train", "test"):
        write_jsonl(tmp_path / "hs" / f"hard_{split}.jsonl",
                    [{"id": f"{split}{i}", "question": f"q {split} {i}", "answer": "1", "source": "math",
                      "meta": json.dumps({"level": 5}), "provenance": "{}"} for i in range(2)])
    train, test, source = given_hard_set(hard_cfg(tmp_path / "hs"))
    assert [p.id for p in train + test] == ["train0", "train1", "test0", "test1"] and source == str(tmp_path / "hs")
    assert train[0].meta["level"] == 5 and train[0].source == "math"
    with pytest.raises(ConfigError, match="neither hard_train.jsonl and hard_test.jsonl nor a manifest.jsonl"):
        given_hard_set(hard_cfg(tmp_path))
