"""The CUDA micro-benchmarks: built when nvcc is present, clean without a GPU, correct and
timed with one (marked gpu, skipped here); calibrating a catalog from measurements."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

import espresso as es
from espresso import calibrate
from espresso import gpu as gpu_bench
from espresso.cli import main

HAS_GPU = bool(gpu_bench.status().get("available"))
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA compiler on PATH")
def test_cuda_module_is_built_and_imports_when_nvcc_is_present() -> None:
    import espresso._cuda as cuda

    assert gpu_bench.built()
    info = cuda.device_info(0)
    assert set(info) >= {"available", "error", "name", "count"}
    if not info["available"]:
        assert info["error"]  # says why


def test_without_the_module_status_names_the_build_switch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "espresso._cuda", None)
    st = gpu_bench.status()
    assert st["available"] is False and not st["built"]
    assert "ESPRESSO_CUDA=ON" in st["error"]
    with pytest.raises(gpu_bench.GpuUnavailable, match="were not built"):
        gpu_bench.run()


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present")
def test_bench_gpu_without_a_gpu_says_so_and_exits_0(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b.json"
    assert main(["bench-gpu", "--json", str(out)]) == 0
    assert "No CUDA GPU to benchmark" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["results"] == [] and data["device"]["available"] is False
    with pytest.raises(gpu_bench.GpuUnavailable, match=r"no CUDA GPU|not built"):
        gpu_bench.run()


@pytest.mark.parametrize(("name", "want"), [
    ("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"),
    ("Tesla T4", "T4"), ("NVIDIA RTX A6000", "RTX-A6000"),
    ("NVIDIA GeForce RTX 4090", "RTX-4090"), ("NVIDIA GH200 480GB", None),
])
def test_device_names_match_catalog_types(name: str, want: str | None) -> None:
    got = gpu_bench.match_catalog(name, es.Catalog.builtin("gpus"))
    assert (got.name if got else None) == want


def bench_result(gemm_tflops: float, triad_gbs: float, verified: bool = True) -> dict:
    """The shape `espresso bench-gpu --json` writes (numbers chosen for the test)."""
    return {"catalog_gpu": "H200", "results": [
        {"name": "gemm_bf16", "rate": gemm_tflops, "unit": "TFLOP/s", "verified": verified},
        {"name": "triad", "rate": triad_gbs, "unit": "GB/s", "verified": True}]}


def test_calibrate_from_a_bench_result(tmp_path: Path) -> None:
    cat = es.Catalog.builtin("gpus")
    new, changes = calibrate.from_bench(cat, bench_result(494.5, 3900.0), "H200")
    h = new["H200"]
    assert h.efficiency == pytest.approx(494.5 / cat["H200"].bf16_tflops, abs=1e-4)
    assert h.mem_bandwidth_gbs == pytest.approx(3900.0 / 0.8, abs=0.1)
    assert new["L4"] == cat["L4"] and len(changes) == 2
    # Unverified kernels are not used; an impossible rate is refused.
    _, changes = calibrate.from_bench(cat, bench_result(494.5, 3900.0, verified=False), "H200")
    assert len(changes) == 1
    with pytest.raises(es.CatalogError, match=r"efficiency of 1\.26"):
        calibrate.from_bench(cat, bench_result(1250.0, 3900.0), "H200")
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench_result(494.5, 3900.0)))
    out = tmp_path / "cat.yaml"
    assert main(["calibrate", "--bench", str(path), "--out", str(out),
                 "--catalog", "builtin:gpus"]) == 0
    assert es.Catalog.load(out)["H200"].efficiency == h.efficiency
    assert yaml.safe_load(out.read_text())["gpus"][0]["name"] == cat.gpus[0].name


def test_calibrate_from_a_profile_reproduces_its_block_time(tmp_path: Path) -> None:
    """After calibration the analytic block forward + backward time on that type equals the
    profile's (the efficiency is what the profile achieved)."""
    from test_profile import profile_with

    cat = es.Catalog.builtin("gpus")
    model = es.ModelSpec.preset("llama2-7b")
    prof = profile_with(model, cat["A100-80GB"], fwd=1.3, bwd=1.1, seq_len=2048,
                        cost=es.CostParams())
    new, _ = calibrate.from_profile(cat, prof)
    job = es.Job(model=model, seq_len=2048, global_batch_size=8, iterations=10,
                 deadline_hours=100)
    plan = es.Plan(job=job, stages=(es.Stage(gpu="A100-80GB", layers=(0, 16)),
                                    es.Stage(gpu="A100-80GB", layers=(16, 32))),
                   num_microbatches=8)
    st = es.estimate(plan, new).stages[0]
    assert st.fwd_s + st.bwd_s == pytest.approx(16 * (prof.block_fwd_s + prof.block_bwd_s),
                                                 rel=1e-3)


@gpu
@pytest.mark.gpu
def test_kernels_verify_and_time_on_the_gpu() -> None:
    out = gpu_bench.run(quick=True)
    names = [r["name"] for r in out["results"]]
    assert names == ["copy", "triad", "gemm_bf16", "host_to_device", "device_to_host"]
    for r in out["results"]:
        assert r["verified"], r
        assert r["rate"] > 0
