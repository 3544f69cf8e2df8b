"""Question loading: formats, bad rows named by file/row/field, skip vs error."""

import json

import pytest

from soar.config import DataConfig
from soar.data import DataError, load_problems

pytestmark = pytest.mark.timeout(120)


def data_cfg(path, **kw):
    return DataConfig(**{"name": "t", "path": str(path), **kw})  # the schema's defaults otherwise


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [{"id": "a", "question": "1+1", "answer": 2}, {"id": "b", "question": "", "answer": "3"},
        {"id": "c", "question": "2+2", "answer": None}, {"id": "d", "question": "27/1", "answer": 27.0}]


def test_jsonl_skips_bad_rows_and_reports_them(tmp_path, caplog):
    path = write(tmp_path / "q.jsonl", ROWS)
    probs = load_problems(data_cfg(path))
    assert [(p.id, p.answer) for p in probs] == [("a", "2"), ("d", "27")]
    text = caplog.text
    assert f"{path}: row 1: field 'question'" in text and f"{path}: row 2: field 'answer'" in text


def test_bad_row_error_mode_names_file_row_field(tmp_path):
    path = write(tmp_path / "q.jsonl", ROWS)
    with pytest.raises(DataError, match=r"q\.jsonl: row 1: field 'question' is missing or empty"):
        load_problems(data_cfg(path, on_bad_row="error"))


def test_column_mapping_limit_ids_parquet_and_save_to_disk(tmp_path):
    import datasets

    rows = [{"problem": f"{i}+1", "solution_answer": str(i + 1)} for i in range(5)]
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "q.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    for path in (tmp_path / "q.parquet", tmp_path / "saved"):
        probs = load_problems(data_cfg(path, problem_key="problem", answer_key="solution_answer", id_key=None, limit=3))
        assert [p.id for p in probs] == ["t/0", "t/1", "t/2"] and probs[2].answer == "3"


def test_duplicate_ids_and_unreadable_files(tmp_path):
    path = write(tmp_path / "dup.jsonl", [{"id": "x", "question": "q", "answer": "1"}] * 2)
    with pytest.raises(DataError, match="row 1: field 'id' duplicates id 'x'"):
        load_problems(data_cfg(path, on_bad_row="error"))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": 1, "question": "q"\n')
    with pytest.raises(DataError, match="broken.jsonl"):
        load_problems(data_cfg(broken))
