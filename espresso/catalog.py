"""GpuType and Catalog: what the cloud offers, at what price, in what quantity."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from . import _io
from . import _validate as v
from ._native import core
from .errors import CatalogError

_REQUIRED = (
    "name",
    "memory_gb",
    "bf16_tflops",
    "mem_bandwidth_gbs",
    "price_per_hour",
    "count",
    "gpus_per_node",
    "intra_node_gbs",
    "inter_node_gbs",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuType:
    """One GPU type of a catalog."""

    name: str
    """Unique key, e.g. ``A100-80GB``."""
    memory_gb: float
    """Memory per GPU in GB (1e9 bytes)."""
    bf16_tflops: float
    """Dense bf16 tensor-core peak in TFLOP/s (fp16 where the GPU has no bf16)."""
    mem_bandwidth_gbs: float
    """Device-memory bandwidth in GB/s."""
    price_per_hour: float
    """On-demand USD per GPU-hour."""
    count: int
    """How many of this type the user can get."""
    gpus_per_node: int
    """GPUs per node; a tensor-parallel group lives inside one node."""
    intra_node_gbs: float
    """Per-GPU, one-direction bandwidth inside a node (NVLink or PCIe), GB/s."""
    inter_node_gbs: float
    """Per-GPU, one-direction network bandwidth between nodes, GB/s."""
    spot_price_per_hour: float | None = None
    """Optional spot USD per GPU-hour."""
    efficiency: float | None = None
    """Optional achieved fraction of peak for matmuls (MFU); the cost model's default
    applies when absent."""

    def __post_init__(self) -> None:
        err = CatalogError
        set_ = object.__setattr__
        name = v.string("gpu.name", self.name, err=err)
        set_(self, "name", name)
        where = f"gpu {name!r}"
        set_(self, "memory_gb",
             v.number(f"{where}: memory_gb", self.memory_gb, positive=True, err=err))
        for f in ("bf16_tflops", "mem_bandwidth_gbs", "intra_node_gbs", "inter_node_gbs"):
            # A floor far below any real device keeps every time finite in the core.
            set_(self, f, v.number(f"{where}: {f}", getattr(self, f), positive=True,
                                   minimum=1e-6, maximum=1e9, err=err))
        if self.memory_gb > 1e5 or self.bf16_tflops > 1e6:
            msg = (
                f"{where}: memory_gb {self.memory_gb:g} or bf16_tflops {self.bf16_tflops:g} is "
                "implausibly large (check the units: GB and TFLOP/s)"
            )
            raise CatalogError(msg)
        set_(self, "price_per_hour",
             v.number(f"{where}: price_per_hour", self.price_per_hour, minimum=0, maximum=1e6,
                      err=err))
        if self.spot_price_per_hour is not None:
            set_(self, "spot_price_per_hour",
                 v.number(f"{where}: spot_price_per_hour", self.spot_price_per_hour, minimum=0,
                          err=err))
        set_(self, "count",
             v.integer(f"{where}: count", self.count, minimum=0, maximum=1 << 40, err=err))
        set_(self, "gpus_per_node",
             v.integer(f"{where}: gpus_per_node", self.gpus_per_node, minimum=1, maximum=1024,
                       err=err))
        if self.efficiency is not None:
            eff = v.number(f"{where}: efficiency", self.efficiency, minimum=1e-6, maximum=1.0,
                           err=err)
            set_(self, "efficiency", eff)

    @classmethod
    def from_dict(cls, data: Any) -> GpuType:
        data = v.mapping("gpu", data, err=CatalogError)
        where = f"gpu {data.get('name', '?')!r}"
        v.known_keys(where, data, [f.name for f in fields(cls)], _REQUIRED, err=CatalogError)
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: val for k, val in out.items() if val is not None}

    def _spec(self) -> Any:
        g = core.GpuSpec()
        g.memory_gb = self.memory_gb
        g.tflops = self.bf16_tflops
        g.mem_bandwidth_gbs = self.mem_bandwidth_gbs
        g.intra_node_gbs = self.intra_node_gbs
        g.inter_node_gbs = self.inter_node_gbs
        g.efficiency = self.efficiency or 0.0
        g.price_per_hour = self.price_per_hour
        g.count = self.count
        g.gpus_per_node = self.gpus_per_node
        return g


@dataclass(frozen=True, slots=True, kw_only=True)
class Catalog:
    """An ordered set of GPU types with unique names."""

    gpus: tuple[GpuType, ...]
    """The GPU types, in catalog order."""

    def __post_init__(self) -> None:
        gpus = tuple(self.gpus)
        if not gpus:
            msg = "catalog.gpus: expected at least one GPU type, got none"
            raise CatalogError(msg)
        if len(gpus) > 100_000:
            msg = f"catalog.gpus: at most 100000 GPU types are supported, got {len(gpus)}"
            raise CatalogError(msg)
        seen: set[str] = set()
        for g in gpus:
            if not isinstance(g, GpuType):
                msg = f"catalog.gpus: expected GpuType entries, got {type(g).__name__}"
                raise CatalogError(msg)
            if g.name in seen:
                msg = f"catalog.gpus: GPU name {g.name!r} appears more than once; names are keys"
                raise CatalogError(msg)
            seen.add(g.name)
        object.__setattr__(self, "gpus", gpus)

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self.gpus)

    def __iter__(self) -> Iterator[GpuType]:
        return iter(self.gpus)

    def __contains__(self, name: object) -> bool:
        return any(g.name == name for g in self.gpus)

    @property
    def names(self) -> list[str]:
        return [g.name for g in self.gpus]

    def index(self, name: str) -> int:
        for i, g in enumerate(self.gpus):
            if g.name == name:
                return i
        hint = v.suggest(name, self.names)
        msg = f"unknown GPU type {name!r}{hint}; the catalog has: {', '.join(self.names)}"
        raise CatalogError(msg)

    def __getitem__(self, name: str) -> GpuType:
        return self.gpus[self.index(name)]

    def with_counts(self, **counts: int) -> Catalog:
        """A copy with the availability of some types changed."""
        updated = {name: int(c) for name, c in counts.items()}
        for name in updated:
            self.index(name)
        return Catalog(gpus=tuple(replace(g, count=updated.get(g.name, g.count))
                                  for g in self.gpus))

    # ------------------------------------------------------------------ I/O
    @classmethod
    def builtin(cls) -> Catalog:
        """The built-in catalog of 13 GPU types (sources: docs/catalog.md)."""
        return _builtin()

    @classmethod
    def from_dict(cls, data: Any) -> Catalog:
        data = v.mapping("catalog", data, err=CatalogError)
        v.known_keys("catalog", data, ["gpus"], ["gpus"], err=CatalogError)
        entries = data["gpus"]
        if not isinstance(entries, list):
            msg = f"catalog.gpus: expected a list of GPU types, got {entries!r}"
            raise CatalogError(msg)
        return cls(gpus=tuple(GpuType.from_dict(e) for e in entries))

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": [g.to_dict() for g in self.gpus]}

    @classmethod
    def load(cls, path: str | Path) -> Catalog:
        """Read a catalog from a YAML or JSON file."""
        # YAML parses JSON documents as well.
        catalog: Catalog = v.load_spec("catalog", path, cls.from_dict, err=CatalogError)
        return catalog

    def save(self, path: str | Path) -> None:
        path = Path(path)
        data = self.to_dict()
        text = json.dumps(data, indent=2) if path.suffix == ".json" else yaml.safe_dump(
            data, sort_keys=False)
        _io.write_text("catalog", path, text, err=CatalogError)

    def _specs(self) -> list[Any]:
        return [g._spec() for g in self.gpus]


@cache
def _builtin() -> Catalog:
    text = resources.files("espresso").joinpath("data/catalog.yaml").read_text()
    data = yaml.safe_load(text)
    assert isinstance(data, Mapping)
    return Catalog.from_dict(data)
