from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import espresso as es

REQUIRED_TYPES = {"H200", "H100-SXM", "H100-PCIe", "A100-80GB", "A100-40GB", "L40S", "L4",
                  "A10G", "RTX-A6000", "RTX-4090", "T4", "V100-32GB", "MI300X"}


def test_builtin_catalog_has_the_required_types() -> None:
    cat = es.Catalog.builtin("gpus")
    assert set(cat.names) >= REQUIRED_TYPES
    assert len(cat) >= 13


def test_builtin_dense_peaks_avoid_known_traps() -> None:
    cat = es.Catalog.builtin("gpus")
    # Dense, not sparse: H100/H200 989 (1979 is with sparsity); L40S 362 (733 sparse);
    # tensor-core rates, not the CUDA-core rates (MI300X matrix 1307.4, not 163.4).
    assert cat["H100-SXM"].bf16_tflops == 989
    assert cat["H200"].bf16_tflops == 989
    assert cat["L40S"].bf16_tflops == pytest.approx(362.05)
    assert cat["MI300X"].bf16_tflops == pytest.approx(1307.4)
    assert cat["A100-80GB"].bf16_tflops == 312
    for g in cat:
        assert g.price_per_hour > 0
        assert g.count > 0
        assert g.bf16_tflops / g.memory_gb < 20  # no sparse-quoted outlier


def test_every_builtin_number_has_a_source() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "catalog.md").read_text()
    for g in es.Catalog.builtin("gpus"):
        assert f"| {g.name} |" in doc, f"{g.name} missing from the sources table"


def test_roundtrip_yaml_and_json(tmp_path: Path) -> None:
    cat = es.Catalog.builtin("gpus")
    for suffix in (".yaml", ".json"):
        path = tmp_path / f"cat{suffix}"
        cat.save(path)
        assert es.Catalog.load(path) == cat


def test_lookup_suggests_close_names() -> None:
    cat = es.Catalog.builtin("gpus")
    with pytest.raises(es.CatalogError, match="did you mean 'A100-80GB'"):
        cat["A100-80G"]
    with pytest.raises(es.CatalogError, match="did you mean 'H100-SXM'"):
        cat.index("h100-sxm")


def test_with_counts() -> None:
    cat = es.Catalog.builtin("gpus").with_counts(L4=3)
    assert cat["L4"].count == 3
    with pytest.raises(es.CatalogError):
        cat.with_counts(Nope=3)


GOOD = dict(name="G", memory_gb=80, bf16_tflops=312, mem_bandwidth_gbs=2000, price_per_hour=3.0,
            count=8, gpus_per_node=8, intra_node_gbs=300, inter_node_gbs=25)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("name", "", "gpu.name"),
        ("memory_gb", 0, "memory_gb"),
        ("memory_gb", -80, "memory_gb"),
        ("memory_gb", "80GB", "memory_gb"),
        ("memory_gb", 80e9, "implausibly large"),
        ("bf16_tflops", float("nan"), "bf16_tflops"),
        ("bf16_tflops", 312e12, "bf16_tflops"),
        ("bf16_tflops", 5e6, "implausibly large"),
        ("inter_node_gbs", 1e-12, "inter_node_gbs"),
        ("mem_bandwidth_gbs", 0, "mem_bandwidth_gbs"),
        ("price_per_hour", -1, "price_per_hour"),
        ("price_per_hour", "cheap", "price_per_hour"),
        ("spot_price_per_hour", -0.5, "spot_price_per_hour"),
        ("count", -1, "count"),
        ("count", 1.5, "count"),
        ("gpus_per_node", 0, "gpus_per_node"),
        ("intra_node_gbs", 0, "intra_node_gbs"),
        ("inter_node_gbs", -25, "inter_node_gbs"),
        ("efficiency", 1.5, "efficiency"),
        ("efficiency", 0, "efficiency"),
    ],
)
def test_bad_gpu_fields(field: str, value: object, match: str) -> None:
    with pytest.raises(es.CatalogError, match=match):
        es.GpuType(**{**GOOD, field: value})  # type: ignore[arg-type]


def test_bad_catalog_files(tmp_path: Path) -> None:
    with pytest.raises(es.CatalogError, match="no such file"):
        es.Catalog.load(tmp_path / "nope.yaml")
    p = tmp_path / "c.yaml"
    p.write_text("gpus: [\n")
    with pytest.raises(es.CatalogError, match="cannot parse"):
        es.Catalog.load(p)
    p.write_text(yaml.safe_dump({"gpus": [{**GOOD, "memroy_gb": 3}]}))
    with pytest.raises(es.CatalogError, match="did you mean 'memory_gb'"):
        es.Catalog.load(p)
    p.write_text(yaml.safe_dump({"gpus": [{k: v for k, v in GOOD.items() if k != "count"}]}))
    with pytest.raises(es.CatalogError, match="missing required field 'count'"):
        es.Catalog.load(p)
    p.write_text(yaml.safe_dump({"gpus": [GOOD, GOOD]}))
    with pytest.raises(es.CatalogError, match="more than once"):
        es.Catalog.load(p)
    p.write_text(yaml.safe_dump({"gpus": []}))
    with pytest.raises(es.CatalogError, match="at least one"):
        es.Catalog.load(p)
    p.write_text(yaml.safe_dump({"gpu": [GOOD]}))
    with pytest.raises(es.CatalogError, match="did you mean 'gpus'"):
        es.Catalog.load(p)
    p.write_text(yaml.safe_dump({"gpus": {"name": "G"}}))
    with pytest.raises(es.CatalogError, match="list of GPU types"):
        es.Catalog.load(p)
    j = tmp_path / "c.json"
    j.write_text(json.dumps({"gpus": [{**GOOD, "price_per_hour": None}]}))
    with pytest.raises(es.CatalogError, match=r"c\.json: gpu 'G': price_per_hour"):
        es.Catalog.load(j)
