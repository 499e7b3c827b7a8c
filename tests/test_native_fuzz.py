"""Build the native randomized check (csrc/tests/fuzz_estimate.cpp) with AddressSanitizer
and UndefinedBehaviorSanitizer and run it: hostile inputs must be refused with
std::invalid_argument or give finite, consistent results; any crash, overflow or sanitizer
report fails the test."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
# The harness and every pure C++ file of the core (the search, the placer and the cost model).
SOURCES = [ROOT / "csrc/tests/fuzz_estimate.cpp", *sorted((ROOT / "csrc/espresso").glob("*.cpp"))]


def test_core_survives_hostile_inputs_under_sanitizers(tmp_path: Path) -> None:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None or not all(p.exists() for p in SOURCES):
        pytest.skip("needs a C++ compiler and the csrc/ sources")
    exe = tmp_path / "espresso_fuzz"
    flags = ["-std=c++17", "-O1", "-g", "-pthread", "-fsanitize=address,undefined",
             "-fno-sanitize-recover=all"]

    def compile_one(src: Path) -> subprocess.CompletedProcess[str]:
        obj = tmp_path / f"{src.parent.name}_{src.stem}.o"
        return subprocess.run([cxx, *flags, f"-I{ROOT / 'csrc'}", "-c", str(src), "-o", str(obj)],
                              capture_output=True, text=True, check=False)

    # One translation unit per core (the sanitized build is most of this test's time).
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        builds = list(pool.map(compile_one, SOURCES))
    objects = sorted(tmp_path.glob("*.o"))
    link = subprocess.run([cxx, *flags, *map(str, objects), "-o", str(exe)],
                          capture_output=True, text=True, check=False)
    errors = "".join(b.stderr for b in [*builds, link] if b.returncode != 0)
    if errors and "sanitize" in errors:
        pytest.skip(f"the compiler has no sanitizer runtime: {errors[-300:]}")
    assert not errors and link.returncode == 0, errors
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0",
           "UBSAN_OPTIONS": "print_stacktrace=1"}
    run = subprocess.run([str(exe), "20000", "3"], capture_output=True, text=True, env=env,
                         timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no failures" in run.stdout
    estimates = int(run.stdout.split()[1])
    assert estimates > 5000  # a good share of the inputs were valid and fully checked
    found = re.search(r"(\d+) searches \((\d+) with a plan\)", run.stdout)
    assert found, run.stdout
    searched, planned = int(found[1]), int(found[2])
    assert searched > 200 and planned > 100  # whole searches ran, most found plans
