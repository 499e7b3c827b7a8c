"""GpuType: one row of a catalog, a GPU type or a cloud offer resolved with its GPU's spec.

The bottom of the catalog contract (docs/catalog.md): rows know their own fields, their
validation and the native spec the core computes with; :mod:`espresso.catalog` gathers rows
into a :class:`~espresso.catalog.Catalog`, and :mod:`espresso.cloud` resolves offers into rows.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache
from importlib import resources
from typing import Any

import yaml

from . import _validate as v
from ._native import core
from .cloud.spot_terms import spot_defaults
from .errors import CatalogError

MARKETS = ("on-demand", "spot")
"""How a row's instances are bought."""

ASSUMED = "assumed: 32 GPUs per offer, no quota given"
"""The availability of offers read from a cloud catalog (the built-in snapshot, SkyPilot
files) until a quota file or ``--max-instances`` says otherwise (every assumed availability
begins with ``assumed:``)."""

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
    """Optional achieved fraction of peak for matrix multiplies (measured: ``espresso
    bench-gpu``); the cost model's default applies when absent."""
    memory_bytes: float | None = None
    """Optional capacity of one GPU in bytes as the driver reports it (``nvidia-smi``
    memory.total: 81920 MiB for an "80 GB" A100); absent: ``memory_gb`` x 1e9."""
    gpu: str | None = None
    """The GPU model (a spec name such as ``A100-40GB``) when ``name`` is an offer's key;
    ``None``: ``name`` itself."""
    vendor: str | None = None
    """The GPU's vendor (``NVIDIA``, ``AMD``): one plan never mixes collective backends.
    ``None``: from the built-in spec table by the GPU's name, else NVIDIA."""
    provider: str | None = None
    """Cloud provider of the offer (``aws``, ``gcp``, ``lambda``); ``None`` for a plain
    GPU-type row (one unnamed location shared by all such rows)."""
    region: str | None = None
    zones: tuple[str, ...] = ()
    """Zones of the region where the data lists the instance type (empty: not listed)."""
    instance_type: str | None = None
    network_source: str | None = None
    """Where the inter-instance network figure comes from (``assumption`` when no public
    source states it)."""
    market: str = "on-demand"
    """``on-demand`` or ``spot``. A spot row's ``price_per_hour`` is the spot price; its
    instances may be reclaimed (:mod:`espresso.cloud.spot` adds spot rows to a catalog)."""
    interruptions_per_hour: float | None = None
    """Interruptions per instance-hour; ``None``: the provider's default for a spot row
    (espresso.cloud.spot.SPOT_DEFAULTS), 0 for an on-demand one."""
    recovery_hours: float | None = None
    """Hours until a reclaimed instance of this row is replaced; ``None``: the provider's
    default for a spot row."""
    fp8_tflops: float | None = None
    """Dense fp8 tensor-core peak in TFLOP/s (0: no fp8; an fp8 job cannot use this row).
    ``None``: the built-in spec table's figure for the GPU model, else 0."""
    availability: str | None = None
    """What set ``count``: a quota file's entry, ``--max-instances``, the catalog's stated
    assumption (:data:`ASSUMED`); ``None``: the catalog gives it. Each rented offer's is in
    the plan's rent list."""
    vcpus: int | None = None
    """vCPUs of one instance (quota limits in vCPUs); ``None``: not known (AWS instance
    types of size ``Nxlarge`` have 4N)."""
    pool: str | None = None
    """A limit this row shares with others (a cloud quota: AWS's vCPUs per instance family
    and region, GCP's GPUs per model and region): its name, the same on every row it covers
    (``--quota`` limits set it; docs/catalog.md, "Shared limits")."""
    pool_units: float | None = None
    """What one instance of this row uses of its pool (vCPUs, GPUs, or 1)."""
    pool_limit: float | None = None
    """The pool's capacity, in the same units (the same on every row of the pool)."""
    bf16: bool | None = None
    """The GPU has bf16 tensor cores (``False``: only fp16 jobs can use this row, and
    ``bf16_tflops`` is its fp16 rate). ``None``: the built-in spec table's flag for the GPU
    model, else ``True``."""

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
        if self.memory_bytes is not None:
            set_(self, "memory_bytes", v.number(f"{where}: memory_bytes", self.memory_bytes,
                                                positive=True, maximum=1e15, err=err))
        if self.efficiency is not None:
            eff = v.number(f"{where}: efficiency", self.efficiency, minimum=1e-6, maximum=1.0,
                           err=err)
            set_(self, "efficiency", eff)
        for f in ("gpu", "vendor", "provider", "region", "instance_type", "network_source"):
            if getattr(self, f) is not None:
                set_(self, f, v.string(f"{where}: {f}", getattr(self, f), err=err))
        zones = self.zones
        if isinstance(zones, str) or not isinstance(zones, (list, tuple)):
            msg = f"{where}: zones: expected a list of zone names, got {zones!r}"
            raise CatalogError(msg)
        set_(self, "zones", tuple(v.string(f"{where}: zones[]", z, err=err) for z in zones))
        if self.vendor is None:
            set_(self, "vendor", _default_vendor(self.model))
        if self.fp8_tflops is None:
            set_(self, "fp8_tflops", _default_fp8(self.model))
        else:
            set_(self, "fp8_tflops", v.number(f"{where}: fp8_tflops", self.fp8_tflops,
                                              minimum=0, maximum=1e6, err=err))
        if self.vcpus is not None:
            set_(self, "vcpus", v.integer(f"{where}: vcpus", self.vcpus, minimum=1,
                                          maximum=1 << 20, err=err))
        pooled = [f for f in ("pool", "pool_units", "pool_limit") if getattr(self, f) is not None]
        if pooled and len(pooled) != 3:
            msg = (f"{where}: pool, pool_units and pool_limit go together; got only "
                   f"{', '.join(pooled)}")
            raise CatalogError(msg)
        if pooled:
            set_(self, "pool", v.string(f"{where}: pool", self.pool, err=err))
            set_(self, "pool_units", v.number(f"{where}: pool_units", self.pool_units,
                                              minimum=0, maximum=1e9, err=err))
            set_(self, "pool_limit", v.number(f"{where}: pool_limit", self.pool_limit,
                                              minimum=0, maximum=1e12, err=err))
        if self.availability is not None:
            set_(self, "availability", v.string(f"{where}: availability", self.availability,
                                                err=err))
        set_(self, "bf16", _default_bf16(self.model) if self.bf16 is None else
             v.boolean(f"{where}: bf16", self.bf16, err=err))
        set_(self, "market", v.choice(f"{where}: market", self.market, MARKETS, err=err))
        for f, top in (("interruptions_per_hour", 1e3), ("recovery_hours", 1e4)):
            if getattr(self, f) is not None:
                set_(self, f, v.number(f"{where}: {f}", getattr(self, f), minimum=0,
                                       maximum=top, err=err))

    @property
    def model(self) -> str:
        """The GPU model's name (``gpu``, or ``name`` for a plain GPU-type row)."""
        return self.gpu or self.name

    @property
    def instance_price_per_hour(self) -> float:
        """USD per hour of one whole instance (``gpus_per_node`` GPUs)."""
        return self.price_per_hour * self.gpus_per_node

    @property
    def instances(self) -> int:
        """Whole instances available (``count`` GPUs, rounded up)."""
        return -(-self.count // self.gpus_per_node)

    @property
    def location(self) -> str:
        """``provider/region`` of an offer; ``local`` for a plain GPU-type row."""
        return f"{self.provider}/{self.region}" if self.provider else "local"

    @property
    def instance_label(self) -> str:
        """The instance type, or ``N x <gpu> node`` for a plain GPU-type row."""
        return self.instance_type or f"{self.gpus_per_node}x {self.model} node"

    @classmethod
    def from_dict(cls, data: Any) -> GpuType:
        data = v.mapping("gpu", data, err=CatalogError)
        where = f"gpu {data.get('name', '?')!r}"
        v.known_keys(where, data, [f.name for f in fields(cls)], _REQUIRED, err=CatalogError)
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["zones"] = list(self.zones)
        if out["vendor"] == _default_vendor(self.model):
            out["vendor"] = None
        if out["fp8_tflops"] == _default_fp8(self.model):
            out["fp8_tflops"] = None
        if out["bf16"] == _default_bf16(self.model):
            out["bf16"] = None
        if out["market"] == "on-demand":
            out["market"] = None
        return {k: val for k, val in out.items() if val is not None and val != []}

    def _spec(self) -> Any:
        g = core.GpuSpec()
        g.memory_gb = self.memory_gb
        g.memory_bytes = self.memory_bytes or 0.0
        g.tflops = self.bf16_tflops
        g.fp8_tflops = self.fp8_tflops or 0.0
        g.mem_bandwidth_gbs = self.mem_bandwidth_gbs
        g.intra_node_gbs = self.intra_node_gbs
        g.inter_node_gbs = self.inter_node_gbs
        g.efficiency = self.efficiency or 0.0
        g.price_per_hour = self.price_per_hour
        g.count = self.count
        g.gpus_per_node = self.gpus_per_node
        g.interruptions_per_hour = self.interruption_rate
        g.recovery_hours = self.recovery
        return g

    @property
    def network_assumed(self) -> bool:
        """The network between instances is an assumption, not a published figure (a
        provider without one, an instance type the table does not know, ``--network-gbs``)."""
        return self.network_source is not None and "(assumption" in self.network_source

    @property
    def is_spot(self) -> bool:
        """Instances of this row may be reclaimed (a spot row, or a rate given)."""
        return self.interruption_rate > 0

    @property
    def interruption_rate(self) -> float:
        """Interruptions per instance-hour: the row's own, else the provider's spot default
        for a spot row, else 0."""
        if self.interruptions_per_hour is not None:
            return self.interruptions_per_hour
        if self.market != "spot":
            return 0.0
        return spot_defaults(self.provider).interruptions_per_hour

    @property
    def recovery(self) -> float:
        """Hours to replace a reclaimed instance (the row's own or the provider's default)."""
        if self.recovery_hours is not None:
            return self.recovery_hours
        if self.market != "spot" and self.interruptions_per_hour is None:
            return 0.0
        return spot_defaults(self.provider).recovery_hours


@cache
def _spec_vendors() -> dict[str, str]:
    text = resources.files("espresso").joinpath("data/gpu_specs.yaml").read_text()
    data = yaml.safe_load(text)
    return {str(row["name"]): str(row["vendor"]) for row in data["specs"]}


def _default_vendor(model: str) -> str:
    return _spec_vendors().get(model, "NVIDIA")


@cache
def _spec_fp8() -> dict[str, float]:
    text = resources.files("espresso").joinpath("data/gpu_specs.yaml").read_text()
    data = yaml.safe_load(text)
    return {str(row["name"]): float(row.get("fp8_tflops", 0.0)) for row in data["specs"]}


def _default_fp8(model: str) -> float:
    return _spec_fp8().get(model, 0.0)


@cache
def _spec_bf16() -> dict[str, bool]:
    text = resources.files("espresso").joinpath("data/gpu_specs.yaml").read_text()
    data = yaml.safe_load(text)
    return {str(row["name"]): bool(row.get("bf16", True)) for row in data["specs"]}


def _default_bf16(model: str) -> bool:
    return _spec_bf16().get(model, True)


def runs_precision(g: GpuType, precision: str) -> bool:
    """A job of ``precision`` can run on the row: fp16 on any GPU, bf16 on GPUs with bf16
    tensor cores, fp8 on those with fp8 ones too (:func:`runs_fp8`)."""
    if precision == "fp16":
        return True
    return bool(g.bf16) and (precision != "fp8" or runs_fp8(g))


def runs_fp8(g: GpuType) -> bool:
    """The row's GPU has fp8 tensor cores faster than its bf16 ones (an fp8 job can use it)."""
    return (g.fp8_tflops or 0.0) > g.bf16_tflops
