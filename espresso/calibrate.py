"""Write measured rates into a catalog (``espresso calibrate``), so later plans use them.

* From ``espresso bench-gpu --json``: ``efficiency`` becomes the measured bf16 matrix-multiply
  rate over the catalog's dense peak, and ``mem_bandwidth_gbs`` the measured triad bandwidth
  divided by the cost model's ``memory_bandwidth_efficiency``, so that the bandwidth the model
  achieves (peak x that efficiency) equals the measurement.
* From a profile (``espresso profile``): ``efficiency`` becomes the achieved fraction of peak
  of one block's forward and backward, ``3 F / (peak (t_f + t_b))``, F the block's analytic
  forward FLOPs at the profiled shape. (A profile can also be used as it is, with
  ``--profile``, which keeps forward, backward, head and memory apart.)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ._native import core
from .catalog import Catalog, GpuType
from .cost import CostParams
from .errors import CatalogError
from .model import ModelSpec
from .profile import Profile


def _with(catalog: Catalog, gpu: GpuType) -> Catalog:
    return Catalog(gpus=tuple(gpu if g.name == gpu.name else g for g in catalog))


def _efficiency(name: str, value: float, what: str) -> float:
    if not 0 < value <= 1:
        msg = (f"{name}: the measured {what} implies an efficiency of {value:.3g} of the "
               "catalog's peak; expected within (0, 1]: is bf16_tflops right for this GPU?")
        raise CatalogError(msg)
    return value


def from_bench(catalog: Catalog, bench: dict[str, Any], gpu: str,
               cost: CostParams | None = None) -> tuple[Catalog, list[str]]:
    """The catalog with ``gpu`` calibrated from a bench-gpu result; and what changed."""
    cost = cost or CostParams()
    g = catalog[gpu]
    by_name = {r["name"]: r for r in bench.get("results", [])}
    changes: list[str] = []
    new = g
    if "gemm_bf16" in by_name and by_name["gemm_bf16"].get("verified"):
        tflops = float(by_name["gemm_bf16"]["rate"])
        eff = _efficiency(gpu, tflops / g.bf16_tflops, f"{tflops:.1f} TFLOP/s")
        changes.append(f"efficiency {g.efficiency} -> {eff:.4f} ({tflops:.1f} of "
                       f"{g.bf16_tflops:g} TFLOP/s)")
        new = replace(new, efficiency=round(eff, 4))
    if "triad" in by_name and by_name["triad"].get("verified"):
        gbs = float(by_name["triad"]["rate"])
        bw = gbs / cost.memory_bandwidth_efficiency
        changes.append(f"mem_bandwidth_gbs {g.mem_bandwidth_gbs:g} -> {bw:.0f} (triad "
                       f"{gbs:.0f} GB/s / memory_bandwidth_efficiency "
                       f"{cost.memory_bandwidth_efficiency:g})")
        new = replace(new, mem_bandwidth_gbs=round(bw, 1))
    if not changes:
        msg = "the bench-gpu result has no verified gemm_bf16 or triad measurement"
        raise CatalogError(msg)
    return _with(catalog, new), changes


def from_profile(catalog: Catalog, profile: Profile) -> tuple[Catalog, list[str]]:
    """The catalog with the profile's GPU type calibrated from its block times."""
    g = catalog[profile.gpu]
    model = ModelSpec.from_dict(profile.model)
    flops = core.block_fwd_flops(model._dims(), profile.seq_len, profile.micro_batch_size)
    achieved = 3 * flops / (profile.block_fwd_s + profile.block_bwd_s)
    eff = _efficiency(g.name, achieved / (g.bf16_tflops * 1e12),
                      f"{achieved / 1e12:.2f} TFLOP/s per block")
    changes = [f"efficiency {g.efficiency} -> {eff:.4g} ({achieved / 1e12:.2f} of "
               f"{g.bf16_tflops:g} TFLOP/s in {model.name}'s blocks on {profile.device})"]
    return _with(catalog, replace(g, efficiency=float(f"{eff:.4g}"))), changes
