"""Every file the package and the CLI read or write: clear errors (what, file, reason; exit 2,
never a traceback), atomic writes, outputs refused before the work, YAML numbers in
scientific notation."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

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


# ---------------------------------------------------------------------- hostile files
# Issue 25: a FIFO, socket, device or directory where a file belongs is refused by name,
# before a byte is read (a FIFO would block, /dev/zero never ends), on every file argument
# of every command; outputs go to regular files only, and a symlink is written through.

def _special(tmp: Path, kind: str, name: str) -> str:
    """A special file of ``kind`` at ``tmp/name``; devices are private nodes (root only),
    so a regression can only replace this test's file, never the machine's /dev/null."""
    p = tmp / name
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "dir":
        p.mkdir()
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(p))
        _SOCKETS.append(s)
    elif kind in ("null", "zero"):
        try:
            os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3 if kind == "null" else 5))
        except PermissionError:
            pytest.skip("making a device node needs root")
    elif kind == "link-to-fifo":
        os.mkfifo(tmp / f"{name}.target")
        p.symlink_to(tmp / f"{name}.target")
    return str(p)


_SOCKETS: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_sockets() -> Any:
    yield
    while _SOCKETS:
        _SOCKETS.pop().close()
_KIND_WORDS = {"fifo": "named pipe", "dir": "directory", "socket": "socket",
               "null": "character device", "zero": "character device",
               "link-to-fifo": "named pipe"}


def _run_cli(argv: list[str], release: list[str], timeout: float = 60.0) -> int:
    """``main(argv)`` in a thread, so that a read that blocks fails the test instead of
    hanging the suite (the FIFOs in ``release`` are then opened for writing, to free it)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["code"] = main(argv)
        except SystemExit as exc:
            box["code"] = exc.code
        except BaseException as exc:  # re-raised below, in the test's thread
            box["exc"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        for f in release:
            with contextlib.suppress(OSError):
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
        t.join(10)
        pytest.fail(f"espresso {' '.join(argv)} blocked for {timeout:g} s")
    if "exc" in box:
        raise box["exc"]
    return int(box["code"])


SMALL = ["--model", "gpt3-1.3b", "--tokens", "1e9", "--deadline", "7d", "--catalog",
         "builtin:gpus", "--time-limit", "5"]
FILE_ARGS = [
    ["gpus", "--catalog", "{f}"],
    ["offers", "--catalog", "{f}"],
    ["offers", "--quota", "{f}"],
    ["plan", "--model", "gpt3-1.3b", "--tokens", "1e9", "--deadline", "7d", "--catalog", "{f}"],
    ["plan", *SMALL, "--quota", "{f}"],
    ["plan", "--tokens", "1e9", "--deadline", "7d", "--model", "{f}"],
    ["plan", *SMALL, "--job", "{f}"],
    ["plan", *SMALL, "--cost-model", "{f}"],
    ["plan", *SMALL, "--profile", "A100-80GB={f}"],
    ["estimate", "{f}"],
    ["estimate", str(EXAMPLE), "--catalog", "{f}"],
    ["estimate", str(EXAMPLE), "--cost-model", "{f}"],
    ["frontier", "--tokens", "1e9", "--model", "gpt3-1.3b", "--catalog", "{f}"],
    ["frontier", "--tokens", "1e9", "--job", "{f}"],
    ["profile", "--gpu", "A100-80GB", "--out", "{out}/p.json", "--model", "{f}"],
    ["calibrate", "--out", "{out}/c.yaml", "--bench", "{f}"],
    ["calibrate", "--out", "{out}/c.yaml", "--profile", "{f}"],
    ["launch", "{f}", "--hosts", "{hosts}"],
    ["launch", str(EXAMPLE), "--hosts", "{f}"],
    ["export", "skypilot", "{f}", "--out", "{out}/sky"],
    ["export", "skypilot", str(EXAMPLE), "--out", "{out}/sky", "--catalog", "{f}"],
    ["bench", "run", "{f}", "--out", "{out}/bench"],
]


@pytest.mark.parametrize("kind", ["fifo", "socket", "dir", "zero", "link-to-fifo"])
@pytest.mark.parametrize("argv", FILE_ARGS, ids=lambda a: " ".join(
    x for x in a[:3] if not x.startswith("/")) + " " + next(x for x in reversed(a)
                                                           if "{f}" in x or x.startswith("-")))
def test_non_regular_inputs_are_refused_before_any_read(
        argv: list[str], kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = _special(tmp_path, kind, "input")
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  - {address: 10.0.0.1, gpu: A100-80GB, gpus: 8}\n")
    (tmp_path / "out").mkdir()
    args = [a.replace("{f}", f).replace("{hosts}", str(hosts))
            .replace("{out}", str(tmp_path / "out")) for a in argv]
    code = _run_cli(args, release=[f, f"{f}.target"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "error:" in err and "Traceback" not in err
    assert _KIND_WORDS[kind] in err or "is a directory" in err, err


OUTPUT_ARGS = [
    ["plan", *SMALL, "--json", "{t}"],
    ["plan", *SMALL, "--plot", "{t}"],
    ["estimate", str(EXAMPLE), "--json", "{t}"],
    ["frontier", "--model", "gpt3-1.3b", "--tokens", "1e9", "--catalog", "builtin:gpus",
     "--max-points", "1", "--json", "{t}"],
    ["bench-gpu", "--json", "{t}"],
    ["profile", "--model", "gpt3-1.3b", "--gpu", "A100-80GB", "--out", "{t}"],
    ["calibrate", "--profile", "{t}.prof", "--out", "{t}"],
]


@pytest.mark.parametrize("kind", ["fifo", "socket", "dir", "null"])
@pytest.mark.parametrize("argv", OUTPUT_ARGS, ids=lambda a: f"{a[0]} {a[-2]}")
def test_outputs_go_to_regular_files_only(argv: list[str], kind: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    t = _special(tmp_path, kind, "out.png" if "--plot" in argv else "out")
    before = os.lstat(t).st_mode
    code = _run_cli([a.replace("{t}", t) for a in argv], release=[t])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "regular files only" in err or "is a directory" in err, err
    assert os.lstat(t).st_mode == before  # still the FIFO, socket, device or folder


def test_a_symlinked_output_is_written_through(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert main(["estimate", str(EXAMPLE), "--json", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)  # the link is kept
    assert es.Plan.from_json(target).estimate is not None  # the file it names is written
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "new.json")
    assert main(["estimate", str(EXAMPLE), "--json", str(dangling)]) == 0
    assert dangling.is_symlink() and (tmp_path / "new.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dangling.json", "link.json", "new.json", "real.json"]  # no temporary file left


def test_an_overwritten_output_keeps_its_permissions(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    out.write_text("old")
    out.chmod(0o600)
    assert main(["estimate", str(EXAMPLE), "--json", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


@pytest.mark.parametrize("argv", [
    ["plan", *SMALL, "--json", ""],
    ["gpus", "--catalog", ""],
    ["estimate", str(EXAMPLE), "--catalog", ""],
    ["plan", *SMALL, "--quota", ""],
    ["export", "skypilot", str(EXAMPLE), "--out", ""],
    ["launch", str(EXAMPLE), "--hosts", ""],
], ids=lambda a: f"{a[0]} {a[-2]}")
def test_empty_paths_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{argv[-2]}: an empty name" in err


def test_names_too_long_for_the_file_system(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    long = "x" * 5000
    for argv in (["plan", "--model", long, "--tokens", "1e9", "--deadline", "7d"],
                 ["estimate", long], ["bench", "report", long], ["gpus", "--catalog", long]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "(5,000 characters)" in err and long not in err  # named, not printed whole
    with pytest.raises(es.SpecError, match="neither a preset"):
        es.Job.from_dict({"model": long, "tokens": 1e9, "deadline_hours": 10})
    plan = json.loads(EXAMPLE.read_text())
    plan["job"]["model"] = long
    with pytest.raises(es.PlanError, match="neither a preset"):
        es.Plan.from_dict(plan)


@pytest.mark.parametrize(("text", "key"), [
    ("gpus:\n  - name: A\n    price_per_hour: 4\n    price_per_hour: 0.001\n", "price_per_hour"),
    ("a: 1\nb: 2\na: 3\n", "a"),
    ('{"gpus": [], "gpus": []}', "gpus"),
])
def test_duplicate_keys_are_refused(text: str, key: str, tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(_io.FileError, match=f"duplicate key '{key}'"):
        _io.load_yaml("catalog", f)
    # merge keys still work: explicit keys override merged ones
    assert _io.parse_yaml("b: &b {x: 1}\nc: {<<: *b, x: 2}") == {"b": {"x": 1}, "c": {"x": 2}}


def test_duplicate_keys_in_a_plan_file(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace('"dp":', '"dp": 1, "dp":', 1)
    p = tmp_path / "p.json"
    p.write_text(text)
    with pytest.raises(es.PlanError, match="duplicate key 'dp'"):
        es.Plan.from_json(p)
