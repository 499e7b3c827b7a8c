"""Catalog: what the cloud offers, at what price, in what quantity.

A catalog is the finished table the search reads: one row (:class:`GpuType`,
:mod:`espresso.gpu_type`) per rentable
offer, GPU specs joined in. Offers from cloud catalogs (provider, region, instance type) are
resolved into rows by :mod:`espresso.cloud`; the plain GPU-type catalogs of the original
contract are rows already (docs/catalog.md, "Offers")."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from . import _io
from . import _validate as v
from .cloud.networks import GIVEN, not_in_table
from .cloud.offers import Offer, offer_of
from .cloud.skypilot import DEFAULT_GPUS_PER_OFFER, read_skypilot
from .cloud.specs import SpecTable
from .errors import CatalogError
from .gpu_type import ASSUMED, MARKETS, GpuType

__all__ = ["BUILTINS", "MARKETS", "Catalog", "GpuType"]

ASSUMPTION_NOTE = "availability is an assumption"
"""How the note of a catalog whose offers' availability is assumed begins."""


def assumption_note(per: int, *, own_counts: bool) -> str:
    """The catalog note that availability is assumed (``per`` GPUs per offer); with
    ``own_counts``, some offers state their own (a marketplace's listed hosts)."""
    return (f"{ASSUMPTION_NOTE}: {per} GPUs per offer (whole instances)"
            + (" unless the offer states its own (a marketplace's listed hosts)"
               if own_counts else "")
            + "; give your quotas with --quota or --max-instances")


def without_stale_assumption(notes: Sequence[str], rows: Sequence[GpuType]) -> tuple[str, ...]:
    """``notes`` without the availability assumption once no row's count is assumed any more
    (a quota or a cap replaced every one), so the output never contradicts itself."""
    if any((g.availability or "").startswith("assumed:") for g in rows):
        return tuple(notes)
    return tuple(n for n in notes if not n.startswith(ASSUMPTION_NOTE))


def _network_arg(gbs: float | None) -> float | None:
    """``network_gbs`` (``--network-gbs``): GB/s per GPU, or None."""
    if gbs is None:
        return None
    return v.number("network_gbs (--network-gbs)", gbs, positive=True, minimum=1e-6,
                    maximum=1e6, err=CatalogError)


NETWORK_NOTE = "network assumed for"
"""How a catalog note about assumed networks begins (a plan states its own instead: the
"Network of X" line under its rent list, only for what it rents)."""


def _network_notes(rows: Sequence[GpuType]) -> list[str]:
    """What a catalog assumes of networks without a published figure: one note per
    assumption, with the instance types it covers (at most five named)."""
    by: dict[str, list[str]] = {}
    for g in rows:
        if g.network_source is not None and not_in_table(g.network_source):
            # (a given figure is per GPU: one note, whatever the instances' GPU counts)
            label = (g.network_source.split(" (", 1)[1].rstrip(")")
                     if GIVEN in g.network_source else g.network_source)
            by.setdefault(label, [])
            if g.instance_type not in by[label]:
                by[label].append(str(g.instance_type))
    out = []
    for label, types in by.items():
        named = ", ".join(types[:5]) + (", ..." if len(types) > 5 else "")
        out.append(f"{NETWORK_NOTE} {len(types)} instance type"
                   f"{'s' if len(types) > 1 else ''} without a published figure ({named}): "
                   f"{label}")
    return out


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
    def from_dict(cls, data: Any, *, network_gbs: float | None = None) -> Catalog:
        """A catalog from ``{"gpus": [...]}`` (GPU-type rows), ``{"offers": [...],
        "specs": [...]}`` (cloud offers, specs optional over the built-in table), or both.
        ``network_gbs``: GB/s per GPU between instances of offers whose instance type has no
        published figure (default: the provider class's, docs/catalog.md)."""
        network_gbs = _network_arg(network_gbs)
        data = v.mapping("catalog", data, err=CatalogError)
        v.known_keys("catalog", data, ["gpus", "offers", "specs", "notes", "skipped"], [],
                     err=CatalogError)
        skipped = data.get("skipped", [])  # a snapshot's build report (what it left out)
        if not isinstance(skipped, list) or not all(isinstance(x, str) for x in skipped):
            msg = f"catalog.skipped: expected a list of strings, got {skipped!r}"
            raise CatalogError(msg)
        if "gpus" not in data and "offers" not in data:
            msg = "catalog: expected `gpus` (GPU types) or `offers` (cloud offers), got neither"
            raise CatalogError(msg)
        rows: list[GpuType] = []
        entries = data.get("gpus", [])
        if not isinstance(entries, list):
            msg = f"catalog.gpus: expected a list of GPU types, got {entries!r}"
            raise CatalogError(msg)
        rows.extend(GpuType.from_dict(e) for e in entries)
        notes = data.get("notes", [])
        if not isinstance(notes, list):
            msg = f"catalog.notes: expected a list of strings, got {notes!r}"
            raise CatalogError(msg)
        if "offers" in data or "specs" in data:
            specs = SpecTable.from_list(data.get("specs", []), base=SpecTable.builtin())
            offers = data.get("offers", [])
            if not isinstance(offers, list):
                msg = f"catalog.offers: expected a list of offers, got {offers!r}"
                raise CatalogError(msg)
            # Offers of a catalog whose notes say their availability is assumed state it.
            assumed = any(str(n).startswith(ASSUMPTION_NOTE) for n in notes)
            rows.extend(Offer.from_dict(o).resolve(specs, network_gbs=network_gbs,
                                                   availability=ASSUMED if assumed else None)
                        for o in offers)
        given = tuple(str(n) for n in notes)  # (a saved catalog has its network notes)
        return cls(gpus=tuple(rows),
                   notes=(*given, *(n for n in _network_notes(rows) if n not in given)))

    @classmethod
    def from_skypilot(cls, paths: str | Path | Sequence[str | Path], *,
                      providers: list[str] | None = None, regions: list[str] | None = None,
                      gpus: list[str] | None = None, bf16_only: bool = False,
                      gpus_per_offer: int | None = None,
                      network_gbs: float | None = None) -> Catalog:
        """Offers from SkyPilot ``vms.csv`` files (each named after its provider, or given
        as ``PROVIDER=FILE``), filtered by providers, regions (shell patterns) and GPU models.
        Rows that cannot become offers are counted in ``notes``, never guessed. Each offer's
        availability is the instances holding ``gpus_per_offer`` GPUs (default 32): an
        assumption stated in ``notes``; set quotas with :func:`espresso.cloud.quota.apply_quota`.
        ``network_gbs`` as in :meth:`from_dict`."""
        network_gbs = _network_arg(network_gbs)
        items = [paths] if isinstance(paths, (str, Path)) else list(paths)
        per = DEFAULT_GPUS_PER_OFFER if gpus_per_offer is None else gpus_per_offer
        read = read_skypilot(items, providers=providers, regions=regions, gpus=gpus,
                             bf16_only=bf16_only, gpus_per_offer=per)
        if not read.offers:
            detail = "; ".join(read.summary()) or "no GPU rows passed the filters"
            msg = f"skypilot catalog {', '.join(map(str, items))}: no offers ({detail})"
            raise CatalogError(msg)
        specs = SpecTable.builtin()
        notes = (f"SkyPilot catalog: {', '.join(map(str, items))} ({len(read.offers)} offers "
                 f"from {read.rows} GPU rows)",
                 assumption_note(per, own_counts=any(o.availability for o in read.offers)),
                 *read.summary())
        rows = [o.resolve(specs, network_gbs=network_gbs,
                          availability=ASSUMED.replace("32", str(per)))
                for o in read.offers]
        # (a marketplace's file states its hosts: no assumption to note)
        return cls(gpus=tuple(rows),
                   notes=(*without_stale_assumption(notes, rows), *_network_notes(rows)))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.notes:
            out["notes"] = list(self.notes)
        plain = [g.to_dict() for g in self.gpus if not g.provider]
        if plain:
            out["gpus"] = plain
        offers = [g for g in self.gpus if g.provider]
        if offers:
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
                if g.fp8_tflops:
                    spec["fp8_tflops"] = g.fp8_tflops
                if not g.bf16:
                    spec["bf16"] = False
                known = builtin[g.model].to_dict() if g.model in builtin else None
                if known is None or any(known.get(k) != val for k, val in spec.items()
                                        if k != "intra_node_gbs"):
                    specs.setdefault(g.model, spec)
            if specs:
                out["specs"] = list(specs.values())
            out["offers"] = [offer_of(g).to_dict() for g in offers]
        return out

    @classmethod
    def open(cls, source: str | None, *, network_gbs: float | None = None) -> Catalog:
        """A catalog as ``--catalog`` names it: a YAML/JSON file, ``skypilot:FILE[,FILE...]``
        (SkyPilot vms.csv files, each named after its provider or written PROVIDER=FILE),
        ``builtin:NAME``, or ``None`` for the built-in cloud snapshot. ``network_gbs`` as in
        :meth:`from_dict` (the built-in catalogs know every network they have)."""
        if source is None:
            return cls.builtin()
        if source.startswith("builtin:"):
            return cls.builtin(source.removeprefix("builtin:"))
        if source.startswith("skypilot:"):
            files = [f for f in source.removeprefix("skypilot:").split(",") if f]
            if not files:
                msg = "--catalog skypilot:FILE[,FILE...]: no file given"
                raise CatalogError(msg)
            return cls.from_skypilot(files, network_gbs=network_gbs)
        return cls.load(source, network_gbs=network_gbs)

    @classmethod
    def load(cls, path: str | Path, *, network_gbs: float | None = None) -> Catalog:
        """Read a catalog from a YAML or JSON file (``network_gbs`` as in :meth:`from_dict`)."""
        # YAML parses JSON documents as well.
        catalog: Catalog = v.load_spec(
            "catalog", path, lambda data: cls.from_dict(data, network_gbs=network_gbs),
            err=CatalogError)
        return catalog

    def save(self, path: str | Path) -> None:
        path = Path(path)
        data = self.to_dict()
        text = json.dumps(data, indent=2) if path.suffix == ".json" else yaml.safe_dump(
            data, sort_keys=False)
        _io.write_text("catalog", path, text, err=CatalogError)

    def _specs(self) -> list[Any]:
        return [g._spec() for g in self.gpus]


BUILTINS = {"cloud": "offers.json", "gpus": "catalog.yaml"}
"""Built-in catalogs by name and their files under ``espresso/data``."""


@cache
def _builtin(file: str) -> Catalog:
    text = resources.files("espresso").joinpath(f"data/{file}").read_text()
    data = json.loads(text) if file.endswith(".json") else yaml.safe_load(text)
    assert isinstance(data, Mapping)
    return Catalog.from_dict(data)
