"""Every file the package and the CLI read or write: clear errors (what, file, reason; exit 2,
never a traceback), atomic writes, outputs refused before the work, YAML numbers in
scientific notation."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import espresso as es
from espresso import _io
from espresso.cli import main

ROOT = Path(__file__).parents[1]
EXAMPLE = ROOT / "examples" / "plans" / "llama2-7b-a100-l40s.json"
NOT_UTF8 = b"gpus:\n  - name: \xff\xfe\x00bad\n"


@pytest.fixture
def latin1(tmp_path: Path) -> Path:
    p = tmp_path / "latin1.yaml"
    p.write_bytes(NOT_UTF8)
    return p


@pytest.mark.parametrize("argv", [
    ["gpus", "--catalog", "{f}"],
    ["estimate", "{f}"],
    ["estimate", str(EXAMPLE), "--catalog", "{f}"],
    ["plan", "--job", "{f}"],
    ["plan", "--model", "{f}", "--tokens", "1e9", "--deadline", "1d"],
    ["plan", "--model", "llama2-7b", "--tokens", "1e9", "--deadline", "1d", "--cost-model", "{f}"],
    ["plan", "--model", "llama2-7b", "--tokens", "1e9", "--deadline", "1d",
     "--profile", "L4={f}"],
    ["launch", str(EXAMPLE), "--hosts", "{f}"],
    ["launch", "{f}", "--hosts", "{f}"],
], ids=lambda a: " ".join(a[:2]))
def test_non_utf8_files_are_named(argv: list[str], latin1: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    code = main([a.replace("{f}", str(latin1)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2
    assert "error:" in err and "latin1.yaml" in err and "not UTF-8" in err
    assert "Traceback" not in err


def test_missing_and_directory_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "--catalog", str(tmp_path / "nope.yaml")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert main(["estimate", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["dir", "missing-folder"])
def test_plan_output_refused_before_the_search(target: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path if target == "dir" else tmp_path / "no" / "such" / "plan.json"
    t = time.monotonic()
    code = main(["plan", "--model", "llama2-70b", "--tokens", "1e11", "--deadline", "30d",
                 "--json", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert "--json" in err and ("is a directory" in err or "does not exist" in err)
    assert time.monotonic() - t < 30  # refused up front, not after a search


def test_estimate_json_to_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", str(EXAMPLE), "--json", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_launch_out_dir_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "taken"
    f.write_text("x")
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  - {address: 10.0.0.1, gpu: A100-80GB, gpus: 8}\n"
                     "  - {address: 10.0.0.2, gpu: L40S, gpus: 8}\n")
    code = main(["launch", str(EXAMPLE), "--hosts", str(hosts), "--out-dir", str(f)])
    assert code == 2
    assert "exists and is not a folder" in capsys.readouterr().err


def test_atomic_write_leaves_no_partial_file(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "plan.json"
    target.write_text("old")

    def boom(src: str, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(_io.FileError, match=r"plan\.json: no space left on device"):
        _io.write_text("--json", target, "new")
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]  # no temp file left
    _io.write_text("--json", target, "new")
    assert target.read_text() == "new"


def test_yaml_scientific_notation_everywhere(tmp_path: Path) -> None:
    cat = tmp_path / "c.yaml"
    cat.write_text("gpus:\n  - {name: X, memory_gb: 8e1, bf16_tflops: 1E2, price_per_hour: 1e-3,"
                   " count: 8, gpus_per_node: 8, mem_bandwidth_gbs: 2e3, intra_node_gbs: 3e2,"
                   " inter_node_gbs: 2.5e1}\n")
    g = es.Catalog.load(cat)["X"]
    assert (g.price_per_hour, g.memory_gb, g.bf16_tflops) == (1e-3, 80.0, 100.0)
    job = tmp_path / "job.yaml"
    job.write_text("model: llama2-7b\ntokens: 2e10\ndeadline_hours: 1.68e2\n")
    j = es.Job.load(job)
    assert j.tokens == 20_000_000_000 and j.deadline_hours == 168.0
    assert _io.parse_yaml("a: 1e-3\nb: -2E+5\nc: 1.5\nd: 12\ne: 1_000\nf: text") == {
        "a": 1e-3, "b": -2e5, "c": 1.5, "d": 12, "e": 1000, "f": "text"}


def test_plan_json_round_trip_errors(tmp_path: Path) -> None:
    p = tmp_path / "p.json"
    p.write_text("{not json")
    with pytest.raises(es.PlanError, match=r"p\.json: not valid JSON"):
        es.Plan.from_json(p)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(es.PlanError):
        es.Plan.from_json(deep)
    data = json.loads(EXAMPLE.read_text())
    assert es.Plan.from_dict(data).to_dict()["stages"] == data["stages"]


def test_oversized_input_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (_io.MAX_INPUT_BYTES + 1))
    t = time.monotonic()
    assert main(["gpus", "--catalog", str(big)]) == 2
    assert "too large" in capsys.readouterr().err
    assert time.monotonic() - t < 10


def test_json_documents_take_the_json_parser() -> None:
    assert _io.parse_yaml('{"a": 1e-3, "b": [1, 2]}') == {"a": 1e-3, "b": [1, 2]}
    assert _io.parse_yaml("{a: 1e-3}") == {"a": 1e-3}  # YAML flow style falls back
