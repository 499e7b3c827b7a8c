"""The README's Python example runs and prints what the README says."""

from __future__ import annotations

import doctest
import re
import shlex
from pathlib import Path

import pytest

from espresso.cli import build_parser, main

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
    test_command = 'pip install -e ".[test]" && pytest -n auto'
    assert test_command in text
    # CI runs exactly the README's test command
    assert test_command + "\n" in (ROOT / ".ci" / "run").read_text()
    assert (ROOT / "examples/plans/llama2-7b-a100-l40s.json").exists()


def _console_examples() -> list[tuple[list[str], list[str]]]:
    """(argv, expected output lines) of every `$ espresso ...` line in the README's console
    blocks (continuation lines joined)."""
    text = (ROOT / "README.md").read_text()
    out: list[tuple[list[str], list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if not line.startswith("$ "):
                continue
            cmd = line[2:]
            while cmd.endswith("\\") and i < len(lines):
                cmd = cmd[:-1] + " " + lines[i].strip()
                i += 1
            expected = []
            while i < len(lines) and not lines[i].startswith("$ "):
                expected.append(lines[i])
                i += 1
            out.append((shlex.split(cmd.split("#")[0]), expected))
    return out


def _norm(lines: list[str]) -> list[str]:
    # The search line holds timings and thread-dependent counters: compared by its proof only.
    # So is the count of subproblems searched on the Domains line: compared by the winner.
    def one(line: str) -> str:
        if line.startswith("Search:"):
            return "Search: ..." + line.rsplit(";", 1)[-1]
        if line.startswith("Domains:"):
            return "Domains: ..." + line.rsplit(";", 1)[-1]
        return " ".join(line.split())
    return [one(line) for line in lines if line.strip()]


@pytest.mark.parametrize(("argv", "expected"), [
    pytest.param(a, e, id=" ".join(a[:3])) for a, e in _console_examples()])
def test_readme_console_examples(argv: list[str], expected: list[str],
                                 monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Every `espresso plan` and `espresso estimate` in the README prints what the README
    shows; every other `espresso` command line at least parses."""
    if argv[0] != "espresso":
        pytest.skip("not an espresso command")
    monkeypatch.chdir(ROOT)
    if argv[1] not in ("plan", "estimate") or any(a.endswith("a100.json") for a in argv):
        build_parser().parse_args(argv[1:])  # flags and values are accepted
        return
    code = main(argv[1:])
    out = capsys.readouterr().out
    assert code == 0
    assert _norm(out.splitlines()) == _norm(expected)
