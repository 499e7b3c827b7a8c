from __future__ import annotations

import subprocess
import sys

import pytest

import espresso as es
from espresso._optional import require


def test_missing_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # simulates a missing package
    with pytest.raises(es.MissingExtraError, match=r"espresso-planner\[plot\]"):
        require("matplotlib")
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(es.MissingExtraError, match=r"espresso-planner\[torch\]"):
        require("torch")


def test_planner_imports_without_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None; import espresso, espresso.cli; "
            "print(espresso.estimate(espresso.Plan.from_json("
            "'examples/plans/llama2-7b-a100-l40s.json')).feasible)")
    from pathlib import Path
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                       cwd=Path(__file__).parents[1])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"
