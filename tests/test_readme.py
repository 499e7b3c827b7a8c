"""The README's Python example runs and prints what the README says."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def test_readme_python_example(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    monkeypatch.chdir(ROOT)
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    for i, block in enumerate(blocks):
        test = parser.get_doctest(block, {}, f"README[{i}]", "README.md", 0)
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0
    assert result.failed == 0


def test_readme_names_both_setup_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert "pip install . && espresso plan --model llama2-7b --tokens 2e10 --deadline 7d" in text
    assert 'pip install -e ".[test]" && pytest' in text
    assert (ROOT / "examples/plans/llama2-7b-a100-l40s.json").exists()
