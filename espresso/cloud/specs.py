"""The GPU spec table: memory, peak, memory bandwidth, vendor and in-instance link of each GPU
model, joined to offers by name (built-in: ``espresso/data/gpu_specs.yaml``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields
from functools import cache
from importlib import resources
from typing import Any

import yaml

from .. import _validate as v
from ..errors import CatalogError

_NUMBERS = ("memory_gb", "bf16_tflops", "mem_bandwidth_gbs", "intra_node_gbs")


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """What a GPU model is, wherever it is rented."""

    name: str
    vendor: str
    memory_gb: float
    bf16_tflops: float
    mem_bandwidth_gbs: float
    intra_node_gbs: float
    """Per-GPU, one-direction link between the GPUs of one multi-GPU instance."""
    efficiency: float | None = None
    """Measured matrix-multiply fraction of peak (MAMF / peak); the cost model's default
    applies when absent."""
    memory_bytes: float | None = None
    """The card's capacity as the driver reports it (``nvidia-smi`` memory.total); absent:
    ``memory_gb`` GB."""
    fp8_tflops: float | None = None
    """Dense fp8 tensor-core peak, TFLOP/s (absent: no fp8; an fp8 job cannot use it)."""
    aliases: tuple[str, ...] = ()
    """SkyPilot accelerator names of this model."""
    bf16: bool = True
    """Has bf16 tensor cores (the built-in snapshot keeps only these: training-capable)."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        name = v.string("spec.name", self.name, err=CatalogError)
        set_(self, "name", name)
        set_(self, "vendor", v.string(f"spec {name!r}: vendor", self.vendor, err=CatalogError))
        for f in _NUMBERS:
            set_(self, f, v.number(f"spec {name!r}: {f}", getattr(self, f), positive=True,
                                   maximum=1e6, err=CatalogError))
        if self.efficiency is not None:
            set_(self, "efficiency", v.number(f"spec {name!r}: efficiency", self.efficiency,
                                              minimum=1e-6, maximum=1.0, err=CatalogError))
        if self.memory_bytes is not None:
            set_(self, "memory_bytes", v.number(f"spec {name!r}: memory_bytes", self.memory_bytes,
                                                positive=True, maximum=1e15, err=CatalogError))
        if self.fp8_tflops is not None:
            set_(self, "fp8_tflops", v.number(f"spec {name!r}: fp8_tflops", self.fp8_tflops,
                                              minimum=0, maximum=1e6, err=CatalogError))
        set_(self, "aliases", tuple(v.string(f"spec {name!r}: aliases[]", a, err=CatalogError)
                                    for a in self.aliases))
        set_(self, "bf16", v.boolean(f"spec {name!r}: bf16", self.bf16, err=CatalogError))

    @classmethod
    def from_dict(cls, data: Any) -> GpuSpec:
        data = dict(v.mapping("spec", data, err=CatalogError))
        where = f"spec {data.get('name', '?')!r}"
        v.known_keys(where, data, [f.name for f in fields(cls)],
                     ("name", "vendor", *_NUMBERS), err=CatalogError)
        if "aliases" in data:
            if not isinstance(data["aliases"], list):
                msg = f"{where}: aliases: expected a list of names, got {data['aliases']!r}"
                raise CatalogError(msg)
            data["aliases"] = tuple(data["aliases"])
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["aliases"] = list(self.aliases)
        return {k: val for k, val in out.items()
                if val is not None and val != [] and not (k == "bf16" and val)}


class SpecTable:
    """GPU specs by name (and by SkyPilot alias)."""

    def __init__(self, specs: list[GpuSpec] | tuple[GpuSpec, ...]) -> None:
        self._by_name: dict[str, GpuSpec] = {}
        self._by_alias: dict[str, list[GpuSpec]] = {}
        for s in specs:
            if s.name in self._by_name:
                msg = f"specs: GPU {s.name!r} appears more than once; names are keys"
                raise CatalogError(msg)
            self._by_name[s.name] = s
            for a in s.aliases:
                found = self._by_alias.setdefault(a.upper(), [])
                if s not in found:  # aliases differing in case only (L40S, L40s) are one
                    found.append(s)

    @classmethod
    def builtin(cls) -> SpecTable:
        return _builtin()

    @classmethod
    def from_list(cls, rows: Any, base: SpecTable | None = None) -> SpecTable:
        """Specs from a list of mappings; names not given come from ``base``."""
        if not isinstance(rows, list):
            msg = f"catalog.specs: expected a list of GPU specs, got {rows!r}"
            raise CatalogError(msg)
        mine = [GpuSpec.from_dict(r) for r in rows]
        names = {s.name for s in mine}
        inherited = [s for s in base] if base is not None else []
        return cls([*mine, *(s for s in inherited if s.name not in names)])

    def __iter__(self) -> Iterator[GpuSpec]:
        return iter(self._by_name.values())

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> GpuSpec:
        try:
            return self._by_name[name]
        except KeyError:
            hint = v.suggest(name, list(self._by_name))
            msg = (f"unknown GPU {name!r}{hint}: no spec for it (give one under `specs:`); "
                   f"known: {', '.join(self._by_name)}")
            raise CatalogError(msg) from None

    def by_alias(self, alias: str) -> list[GpuSpec]:
        return list(self._by_alias.get(alias.upper(), []))


@cache
def _builtin() -> SpecTable:
    text = resources.files("espresso").joinpath("data/gpu_specs.yaml").read_text()
    data = yaml.safe_load(text)
    return SpecTable.from_list(data["specs"])
