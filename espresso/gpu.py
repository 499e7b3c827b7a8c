"""CUDA micro-benchmarks (``espresso bench-gpu``): device-memory bandwidth (copy, triad), a
hand-written bf16 tensor-core matrix multiply, and pinned host<->device copies, each checked
against a CPU reference on random data before it is timed.

The kernels live in the optional extension ``espresso._cuda``, built only when a CUDA compiler
is found at install time (CMake switch ``ESPRESSO_CUDA``). Without it, or without a GPU,
:func:`status` says why and :func:`run` raises :class:`GpuUnavailable`.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from .catalog import Catalog, GpuType
from .errors import EspressoError


class GpuUnavailable(EspressoError):
    """No CUDA GPU to benchmark (module not built, no driver, or no device)."""


def _module() -> Any:
    try:
        return importlib.import_module("espresso._cuda")
    except ImportError as exc:
        msg = ("the CUDA micro-benchmarks were not built (no CUDA compiler when the package "
               f"was installed: {exc}); reinstall with nvcc on PATH, or with "
               "-Ccmake.define.ESPRESSO_CUDA=ON to make a missing compiler an error")
        raise GpuUnavailable(msg) from None


def built() -> bool:
    """Whether the CUDA extension was built."""
    try:
        _module()
    except GpuUnavailable:
        return False
    return True


def status(device: int = 0) -> dict[str, Any]:
    """The device's description (``available``, ``name``, ``memory_gb``, ...), or
    ``available: False`` with the reason in ``error``."""
    try:
        mod = _module()
    except GpuUnavailable as exc:
        return {"available": False, "error": str(exc), "built": False}
    info: dict[str, Any] = dict(mod.device_info(device))
    info["built"] = True
    return info


def match_catalog(name: str, catalog: Catalog) -> GpuType | None:
    """The catalog type a CUDA device name denotes (``NVIDIA H100 80GB HBM3`` -> H100-SXM)."""
    n = name.upper().replace("NVIDIA", "").replace("GEFORCE", "").strip()
    tokens = set(re.split(r"[\s_-]+", n))
    best: tuple[int, GpuType] | None = None
    for g in catalog:
        parts = [p for p in re.split(r"[\s_-]+", g.model.upper()) if p]
        if parts[0] not in tokens:
            continue
        score = sum(1 for p in parts if p in tokens) * 10 - len(parts)
        if parts[0] == "H100" and "PCIE" not in n and "SXM" in g.model.upper():
            score += 5  # the SXM part reports no form factor in its name
        if parts[0] == "A100" and "40GB" not in n and "80GB" in g.model.upper():
            score += 5
        if best is None or score > best[0]:
            best = (score, g)
    return best[1] if best else None


def run(device: int = 0, *, quick: bool = False) -> dict[str, Any]:
    """Verify and time every kernel; returns ``{"device": ..., "results": [...]}``.

    ``quick`` uses small sizes (seconds); otherwise buffers of 1 GiB and an 8192^3 product.
    """
    mod = _module()
    info = status(device)
    if not info.get("available"):
        msg = f"no CUDA GPU to benchmark: {info.get('error') or 'unknown reason'}"
        raise GpuUnavailable(msg)
    mib = 1 << 20
    size = 64 * mib if quick else 1024 * mib
    gemm = 2048 if quick else 8192
    iters = 5 if quick else 20
    results = [
        mod.bench_copy(device, size, iters),
        mod.bench_triad(device, size // 2, iters),
        mod.bench_gemm_bf16(device, gemm, gemm, gemm, max(2, iters // 2)),
        mod.bench_host_copy(device, size // 4, max(2, iters // 4), True),
        mod.bench_host_copy(device, size // 4, max(2, iters // 4), False),
    ]
    return {"device": info, "results": [dict(r) for r in results]}
