"""Rebuilding the built-in snapshot (python -m espresso.cloud.snapshot), from files or from
SkyPilot's installed catalog (issue 30, item 6)."""

# ruff: noqa: E501  (SkyPilot CSV rows are kept verbatim)
from __future__ import annotations

import json
from pathlib import Path

import pytest

import espresso as es
from espresso.cloud import snapshot

LAMBDA = """InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,GpuInfo,SpotPrice
gpu_1x_h100_pcie,H100,1.0,26.0,200.0,2.49,us-east-1,,
gpu_8x_h100_sxm5,H100,8.0,208.0,1800.0,23.92,us-east-1,,
gpu_8x_v100,V100,8.0,92.0,448.0,4.4,us-east-1,,
"""


def test_from_skypilots_installed_catalog(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "catalogs" / "v8"
    (root / "lambda").mkdir(parents=True)
    (root / "lambda" / "vms.csv").write_text(LAMBDA)
    out = tmp_path / "offers.json"
    rc = snapshot.main(["--from-sky", str(root), "--date", "2026-12-07", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0 and f"3 offers -> {out}" in printed
    data = json.loads(out.read_text())
    assert [o["instance_type"] for o in data["offers"]] == ["gpu_1x_h100_pcie",
                                                            "gpu_8x_h100_sxm5", "gpu_8x_v100"]
    assert "SkyPilot's installed catalog" in data["notes"][0] and "2026-12-07" in data["notes"][0]
    # The written file, build report included, loads as a catalog (--catalog FILE), as the
    # built-in one does; the V100 (no bf16) is kept for fp16 jobs and left out of bf16 ones.
    cat = es.Catalog.load(out)
    assert len(cat) == 3
    v100 = [g for g in cat if g.gpu == "V100-16GB"]
    assert len(v100) == 1 and not v100[0].bf16
    with pytest.raises(es.CatalogError, match=r"catalog\.skipped"):
        es.Catalog.from_dict({**data, "skipped": "not a list"})


def test_from_sky_without_a_catalog_names_the_folder(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    rc = snapshot.main(["--from-sky", str(tmp_path), "--providers", "aws,vast",
                        "--date", "2026-12-07", "--out", str(tmp_path / "x.json")])
    out = capsys.readouterr().out
    assert rc == 2 and str(tmp_path) in out and "aws, vast" in out
    assert not (tmp_path / "x.json").exists()
    with pytest.raises(SystemExit):
        snapshot.main(["--from-sky", str(tmp_path), "--providers", "aws,nowhere",
                       "--date", "2026-12-07"])
    with pytest.raises(SystemExit):
        snapshot.main(["--date", "2026-12-07"])  # neither files nor --from-sky
