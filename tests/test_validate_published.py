"""The cost model against published training runs (bench/validate_published.py): every run
rebuilt as published fits in memory, and the errors stay within issue 13's targets
(median |error| <= 10%, none above 20%). A change to the model that breaks this fails here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import yaml

BENCH = Path(__file__).parents[1] / "bench"


def _load() -> object:
    spec = importlib.util.spec_from_file_location("validate_published",
                                                  BENCH / "validate_published.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["validate_published"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_published_runs_within_targets(capsys: object) -> None:
    vp = _load()
    data = yaml.safe_load((BENCH / "published_runs.yaml").read_text())
    rows = vp.evaluate(data)  # type: ignore[attr-defined]
    assert len(rows) >= 12 and len({r.source for r in rows}) >= 3
    assert all(r.feasible for r in rows), [r.id for r in rows if not r.feasible]
    assert all(r.memory_gb <= r.capacity_gb for r in rows)
    _, ok = vp.report(rows)  # type: ignore[attr-defined]
    assert ok, vp.report(rows)[0]  # type: ignore[attr-defined]
    assert vp.main([]) == 0  # type: ignore[attr-defined]
