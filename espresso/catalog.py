"""GpuType and Catalog: what the cloud offers, at what price, in what quantity.

A catalog is the finished table the search reads: one row (:class:`GpuType`) per rentable
offer, GPU specs joined in. Offers from cloud catalogs (provider, region, instance type) are
resolved into rows by :mod:`espresso.cloud`; the plain GPU-type catalogs of the original
contract are rows already (docs/catalog.md, "Offers")."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from . import _io
from . import _validate as v
from ._native import core
from .errors import CatalogError

MARKETS = ("on-demand", "spot")
"""How a row's instances are bought."""

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
        if out["market"] == "on-demand":
            out["market"] = None
        return {k: val for k, val in out.items() if val is not None and val != []}

    def _spec(self) -> Any:
        g = core.GpuSpec()
        g.memory_gb = self.memory_gb
        g.memory_bytes = self.memory_bytes or 0.0
        g.tflops = self.bf16_tflops
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
        from .cloud.spot import spot_defaults

        return spot_defaults(self.provider).interruptions_per_hour

    @property
    def recovery(self) -> float:
        """Hours to replace a reclaimed instance (the row's own or the provider's default)."""
        if self.recovery_hours is not None:
            return self.recovery_hours
        if self.market != "spot" and self.interruptions_per_hour is None:
            return 0.0
        from .cloud.spot import spot_defaults

        return spot_defaults(self.provider).recovery_hours


@dataclass(frozen=True, slots=True, kw_only=True)
class Catalog:
    """An ordered set of GPU types with unique names."""

    gpus: tuple[GpuType, ...]
    """The rows (GPU types, or offers resolved with their GPU specs), in catalog order."""
    notes: tuple[str, ...] = ()
    """What the catalog assumes (e.g. the snapshot's date, a default quota); printed with
    every plan made from it."""
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "notes", tuple(str(n) for n in self.notes))
        gpus = tuple(self.gpus)
        if not gpus:
            msg = "catalog.gpus: expected at least one GPU type, got none"
            raise CatalogError(msg)
        if len(gpus) > 100_000:
            msg = f"catalog.gpus: at most 100000 GPU types are supported, got {len(gpus)}"
            raise CatalogError(msg)
        index: dict[str, int] = {}
        for i, g in enumerate(gpus):
            if not isinstance(g, GpuType):
                msg = f"catalog.gpus: expected GpuType entries, got {type(g).__name__}"
                raise CatalogError(msg)
            if g.name in index:
                msg = f"catalog.gpus: GPU name {g.name!r} appears more than once; names are keys"
                raise CatalogError(msg)
            index[g.name] = i
        object.__setattr__(self, "gpus", gpus)
        object.__setattr__(self, "_index", index)  # name -> row, for lookups in O(1)

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self.gpus)

    def __iter__(self) -> Iterator[GpuType]:
        return iter(self.gpus)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._index

    @property
    def names(self) -> list[str]:
        return [g.name for g in self.gpus]

    def index(self, name: str) -> int:
        i = self._index.get(name) if isinstance(name, str) else None
        if i is not None:
            return i
        names = self.names
        hint = v.suggest(name, names)
        if len(names) > 12:
            models = list(dict.fromkeys(g.model for g in self.gpus))
            shown = (f"{len(names)} offers of {', '.join(models[:16])}"
                     f"{', ...' if len(models) > 16 else ''} (`espresso offers` lists them)")
        else:
            shown = ", ".join(names)
        msg = f"unknown GPU type {name!r}{hint}; the catalog has: {shown}"
        raise CatalogError(msg)

    def __getitem__(self, name: str) -> GpuType:
        return self.gpus[self.index(name)]

    def row(self, gpu: str, offer: str | None = None) -> GpuType:
        """The row a plan's stage names: its offer key, else its GPU (a row of that name, or
        the only row of that GPU model)."""
        if offer is not None:
            return self[offer]
        if gpu in self:
            return self[gpu]
        rows = [g for g in self.gpus if g.model == gpu]
        if len(rows) == 1:
            return rows[0]
        if not rows:
            return self[gpu]  # raises with suggestions
        msg = (f"GPU {gpu!r} is offered {len(rows)} times in the catalog "
               f"({', '.join(r.name for r in rows[:4])}{', ...' if len(rows) > 4 else ''}); "
               "name the offer (stage `offer`)")
        raise CatalogError(msg)

    def model_row(self, gpu: str) -> GpuType:
        """A row of GPU model ``gpu`` (or named ``gpu``): for what depends on the GPU only
        (profiles, calibration), not on where it is rented."""
        if gpu in self:
            return self[gpu]
        for g in self.gpus:
            if g.model == gpu:
                return g
        models = list(dict.fromkeys(g.model for g in self.gpus))
        hint = v.suggest(gpu, models)
        msg = f"unknown GPU {gpu!r}{hint}; the catalog's GPUs: {', '.join(models)}"
        raise CatalogError(msg)

    @property
    def has_offers(self) -> bool:
        """Some row is a cloud offer (provider, region, instance type)."""
        return any(g.provider for g in self.gpus)

    def with_counts(self, **counts: int) -> Catalog:
        """A copy with the availability of some types changed."""
        updated = {name: int(c) for name, c in counts.items()}
        for name in updated:
            self.index(name)
        return Catalog(gpus=tuple(replace(g, count=updated.get(g.name, g.count))
                                  for g in self.gpus), notes=self.notes)

    # ------------------------------------------------------------------ I/O
    @classmethod
    def builtin(cls, name: str = "cloud") -> Catalog:
        """A built-in catalog: ``"cloud"`` (default), the dated snapshot of real AWS, GCP and
        Lambda offers; ``"gpus"``, the 13 GPU types of the reference table with one price
        each (sources: docs/catalog.md)."""
        if name not in BUILTINS:
            msg = f"unknown built-in catalog {name!r}; built-in: {', '.join(BUILTINS)}"
            raise CatalogError(msg)
        return _builtin(BUILTINS[name])

    @classmethod
    def from_dict(cls, data: Any) -> Catalog:
        """A catalog from ``{"gpus": [...]}`` (GPU-type rows), ``{"offers": [...],
        "specs": [...]}`` (cloud offers, specs optional over the built-in table), or both."""
        data = v.mapping("catalog", data, err=CatalogError)
        v.known_keys("catalog", data, ["gpus", "offers", "specs", "notes"], [],
                     err=CatalogError)
        if "gpus" not in data and "offers" not in data:
            msg = "catalog: expected `gpus` (GPU types) or `offers` (cloud offers), got neither"
            raise CatalogError(msg)
        rows: list[GpuType] = []
        entries = data.get("gpus", [])
        if not isinstance(entries, list):
            msg = f"catalog.gpus: expected a list of GPU types, got {entries!r}"
            raise CatalogError(msg)
        rows.extend(GpuType.from_dict(e) for e in entries)
        if "offers" in data or "specs" in data:
            from .cloud.offers import Offer
            from .cloud.specs import SpecTable

            specs = SpecTable.from_list(data.get("specs", []), base=SpecTable.builtin())
            offers = data.get("offers", [])
            if not isinstance(offers, list):
                msg = f"catalog.offers: expected a list of offers, got {offers!r}"
                raise CatalogError(msg)
            rows.extend(Offer.from_dict(o).resolve(specs) for o in offers)
        notes = data.get("notes", [])
        if not isinstance(notes, list):
            msg = f"catalog.notes: expected a list of strings, got {notes!r}"
            raise CatalogError(msg)
        return cls(gpus=tuple(rows), notes=tuple(str(n) for n in notes))

    @classmethod
    def from_skypilot(cls, paths: str | Path | Sequence[str | Path], *,
                      providers: list[str] | None = None, regions: list[str] | None = None,
                      gpus: list[str] | None = None, bf16_only: bool = False,
                      gpus_per_offer: int | None = None) -> Catalog:
        """Offers from SkyPilot ``vms.csv`` files (each named after its provider, or given
        as ``PROVIDER=FILE``), filtered by providers, regions (shell patterns) and GPU models.
        Rows that cannot become offers are counted in ``notes``, never guessed. Each offer's
        availability is the instances holding ``gpus_per_offer`` GPUs (default 32): an
        assumption stated in ``notes``; set quotas with :func:`espresso.cloud.apply_quota`."""
        from .cloud.skypilot import DEFAULT_GPUS_PER_OFFER, read_skypilot

        items = [paths] if isinstance(paths, (str, Path)) else list(paths)
        per = DEFAULT_GPUS_PER_OFFER if gpus_per_offer is None else gpus_per_offer
        read = read_skypilot(items, providers=providers, regions=regions, gpus=gpus,
                             bf16_only=bf16_only, gpus_per_offer=per)
        if not read.offers:
            detail = "; ".join(read.summary()) or "no GPU rows passed the filters"
            msg = f"skypilot catalog {', '.join(map(str, items))}: no offers ({detail})"
            raise CatalogError(msg)
        from .cloud.specs import SpecTable

        specs = SpecTable.builtin()
        notes = (f"SkyPilot catalog: {', '.join(map(str, items))} ({len(read.offers)} offers "
                 f"from {read.rows} GPU rows)",
                 f"availability is an assumption: {per} GPUs per offer (whole instances); "
                 "give your quotas with --quota or --max-instances",
                 *read.summary())
        return cls(gpus=tuple(o.resolve(specs) for o in read.offers), notes=notes)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.notes:
            out["notes"] = list(self.notes)
        plain = [g.to_dict() for g in self.gpus if not g.provider]
        if plain:
            out["gpus"] = plain
        offers = [g for g in self.gpus if g.provider]
        if offers:
            from .cloud.offers import offer_of
            from .cloud.specs import SpecTable

            builtin = SpecTable.builtin()
            specs: dict[str, dict[str, Any]] = {}
            for g in offers:
                spec = {"name": g.model, "vendor": g.vendor, "memory_gb": g.memory_gb,
                        "bf16_tflops": g.bf16_tflops, "mem_bandwidth_gbs": g.mem_bandwidth_gbs,
                        "intra_node_gbs": g.intra_node_gbs}
                if g.efficiency is not None:
                    spec["efficiency"] = g.efficiency
                if g.memory_bytes is not None:
                    spec["memory_bytes"] = g.memory_bytes
                known = builtin[g.model].to_dict() if g.model in builtin else None
                if known is None or any(known.get(k) != val for k, val in spec.items()
                                        if k != "intra_node_gbs"):
                    specs.setdefault(g.model, spec)
            if specs:
                out["specs"] = list(specs.values())
            out["offers"] = [offer_of(g).to_dict() for g in offers]
        return out

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
def _spec_vendors() -> dict[str, str]:
    text = resources.files("espresso").joinpath("data/gpu_specs.yaml").read_text()
    data = yaml.safe_load(text)
    return {str(row["name"]): str(row["vendor"]) for row in data["specs"]}


def _default_vendor(model: str) -> str:
    return _spec_vendors().get(model, "NVIDIA")


BUILTINS = {"cloud": "offers.json", "gpus": "catalog.yaml"}
"""Built-in catalogs by name and their files under ``espresso/data``."""


@cache
def _builtin(file: str) -> Catalog:
    text = resources.files("espresso").joinpath(f"data/{file}").read_text()
    data = json.loads(text) if file.endswith(".json") else yaml.safe_load(text)
    data.pop("skipped", None)  # the snapshot's build report
    assert isinstance(data, Mapping)
    return Catalog.from_dict(data)
