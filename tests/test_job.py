from __future__ import annotations

from pathlib import Path

import pytest

import espresso as es

BASE = dict(model="llama2-7b", seq_len=4096, global_batch_size=512, tokens="20B", deadline="7d")


def test_job_from_dict_with_human_units() -> None:
    job = es.Job.from_dict(BASE)
    assert job.deadline_hours == 168
    assert job.tokens == 20_000_000_000
    # ceil(2e10 / (512 * 4096)) = ceil(9536.74) = 9537
    assert job.num_iterations == 9537
    assert job.model == es.ModelSpec.preset("llama2-7b")


def test_job_iterations_and_inline_model() -> None:
    job = es.Job.from_dict({"model": {"name": "t", "num_layers": 2, "hidden_size": 64,
                                      "num_heads": 4, "vocab_size": 10},
                            "seq_len": 8, "global_batch_size": 4, "iterations": 10,
                            "deadline_hours": 1})
    assert job.num_iterations == 10
    assert job.num_tokens == 320


def test_job_roundtrip(tmp_path: Path) -> None:
    job = es.Job.from_dict(BASE)
    assert es.Job.from_dict(job.to_dict()) == job
    p = tmp_path / "job.yaml"
    p.write_text("model: llama2-7b\nseq_len: 4096\nglobal_batch_size: 512\ntokens: 2.0e10\n"
                 "deadline_hours: 168\n")
    assert es.Job.load(p) == job


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"seq_len": 0}, "job.seq_len"),
        ({"seq_len": "4k"}, "job.seq_len"),
        ({"global_batch_size": -1}, "job.global_batch_size"),
        ({"tokens": "lots"}, "job.tokens"),
        ({"tokens": 0}, "job.tokens"),
        ({"iterations": 100}, "exactly one of tokens or iterations"),
        ({"tokens": None}, "exactly one of tokens or iterations"),
        ({"deadline": "soon"}, "job.deadline_hours"),
        ({"deadline": -5}, "job.deadline_hours"),
        ({"optimizer": "lion"}, "job.optimizer"),
        ({"model": "llama-7b"}, "neither a preset"),
        ({"model": 7}, "job.model"),
        ({"sequence_length": 5}, "unknown field 'sequence_length'"),
    ],
)
def test_bad_job(change: dict[str, object], match: str) -> None:
    with pytest.raises(es.SpecError, match=match):
        es.Job.from_dict({**BASE, **change})


def test_missing_job_fields() -> None:
    # seq_len and global_batch_size default as on the command line (4096, 512)
    job = es.Job.from_dict({k: v for k, v in BASE.items()
                            if k not in ("seq_len", "global_batch_size")})
    assert (job.seq_len, job.global_batch_size) == (4096, 512)
    for key, name in (("model", "model"), ("deadline", "deadline_hours")):
        with pytest.raises(es.JobError, match=f"missing required field '{name}'"):
            es.Job.from_dict({k: v for k, v in BASE.items() if k != key})
    with pytest.raises(es.JobError, match="no such file"):
        es.Job.load("/nonexistent/job.yaml")
