"""Where one plan may run: network domains, vendors, and the subproblems the search solves.

Every plan uses one vendor's GPUs (one collective backend: NCCL or RCCL, never both) and
instances of one *domain*. ``scope`` sets how far a domain reaches:

* ``zone``: one availability zone. Offers without zone data count their region as one zone.
* ``region`` (default): one region; instances in different zones of it pay the cross-zone
  link and the provider's per-GB transfer price.
* ``provider``: one provider; instances in different regions pay the cross-region link and
  transfer price.

The search solves each (domain, vendor) as a subproblem: exact within one location; a
plan that spans locations is priced conservatively: every link between instances runs at
most at the cross-location figure and every pipeline boundary pays the transfer price
(docs/catalog.md, "Scopes"). Plain GPU-type rows (no provider) share one location, ``local``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..catalog import Catalog, GpuType
from ..errors import SpecError

SCOPES = ("zone", "region", "provider")


@dataclass(frozen=True, slots=True)
class Crossing:
    """What a plan spanning locations of one provider pays."""

    usd_per_gb: float
    """Per GB sent between stages in different locations (sender + receiver charges)."""
    link_gbps: float
    """At most this many Gbit/s per instance between instances (one direction)."""
    source: str


# Sources: docs/catalog.md ("Scopes"). AWS: $0.01/GB out of and $0.01/GB into an AZ
# (EC2 on-demand pricing, "Data transfer within the same AWS Region"); inter-region from
# US regions $0.02/GB. GCP: inter-zone $0.01/GB, inter-region within a continent $0.02/GB
# (VPC network pricing). Link caps: assumptions (no EFA/RDMA/GPUDirect across zones; AWS
# caps inter-region traffic at 50% of an instance's bandwidth).
CROSSINGS: dict[tuple[str, str], Crossing] = {
    ("aws", "zone"): Crossing(0.02, 100.0, "AWS EC2 pricing: $0.01/GB each way between AZs; "
                                           "link: assumption (TCP, no EFA across AZs)"),
    ("aws", "region"): Crossing(0.02, 25.0, "AWS EC2 pricing: $0.02/GB between US regions; "
                                            "link: assumption"),
    ("gcp", "zone"): Crossing(0.01, 100.0, "GCP VPC pricing: $0.01/GB between zones; link: "
                                           "assumption (no GPUDirect/RDMA across zones)"),
    ("gcp", "region"): Crossing(0.02, 25.0, "GCP VPC pricing: $0.02/GB between regions of a "
                                            "continent; link: assumption"),
}


@dataclass(frozen=True, slots=True)
class Subproblem:
    """The rows one plan may combine, and what crossing locations costs in it."""

    rows: tuple[int, ...]
    """Indices into the catalog's rows."""
    vendor: str
    provider: str | None
    region: str | None
    zone: str | None
    spans: str | None = None
    """``zone`` or ``region`` when the plans of this subproblem may span locations."""
    crossing: Crossing | None = None

    @property
    def label(self) -> str:
        where = "local" if self.provider is None else "/".join(
            p for p in (self.provider, self.region, self.zone) if p)
        if self.spans:
            where += f" (across {self.spans}s)"
        return f"{where} [{self.vendor}]"

    def domain(self, scope: str) -> dict[str, Any]:
        """The plan JSON's ``domain`` entry."""
        out: dict[str, Any] = {"scope": scope, "provider": self.provider,
                               "region": self.region, "zone": self.zone,
                               "vendor": self.vendor}
        if self.spans and self.crossing is not None:
            out["spans"] = self.spans
            out["transfer_usd_per_gb"] = self.crossing.usd_per_gb
            out["cross_link_gbps"] = self.crossing.link_gbps
        return out


def _zones(g: GpuType) -> tuple[str, ...]:
    return g.zones or (g.region or "local",)


def subproblems(catalog: Catalog, scope: str = "region") -> list[Subproblem]:
    """The (domain, vendor) subproblems of a catalog under ``scope``."""
    if scope not in SCOPES:
        msg = f"scope: expected one of {', '.join(SCOPES)}, got {scope!r}"
        raise SpecError(msg)
    out: list[Subproblem] = []
    seen: set[tuple[tuple[int, ...], str | None]] = set()

    def add(sp: Subproblem) -> None:
        key = (sp.rows, sp.spans)
        if sp.rows and key not in seen:
            seen.add(key)
            out.append(sp)

    by_vendor_provider: dict[tuple[str, str | None], list[int]] = {}
    for i, g in enumerate(catalog.gpus):
        by_vendor_provider.setdefault((g.vendor or "NVIDIA", g.provider), []).append(i)
    for (vendor, provider), idx in by_vendor_provider.items():
        if provider is None:
            add(Subproblem(tuple(idx), vendor, None, None, None))
            continue
        regions: dict[str, list[int]] = {}
        for i in idx:
            regions.setdefault(catalog.gpus[i].region or "", []).append(i)
        for region, ridx in regions.items():
            zones: dict[str, list[int]] = {}
            for i in ridx:
                for z in _zones(catalog.gpus[i]):
                    zones.setdefault(z, []).append(i)
            for z, zidx in sorted(zones.items()):
                add(Subproblem(tuple(zidx), vendor, provider, region,
                               z if catalog.gpus[zidx[0]].zones else None))
            cross = CROSSINGS.get((provider, "zone"))
            if (scope in ("region", "provider") and len(zones) > 1 and cross is not None
                    and not any(set(zidx) == set(ridx) for zidx in zones.values())):
                add(Subproblem(tuple(ridx), vendor, provider, region, None, "zone", cross))
        cross = CROSSINGS.get((provider, "region"))
        if scope == "provider" and len(regions) > 1 and cross is not None:
            add(Subproblem(tuple(idx), vendor, provider, None, None, "region", cross))
    return out


def locations_of(rows: Sequence[GpuType], spans: str | None) -> int:
    """How many distinct locations (zones or regions) a plan's rows occupy at least."""
    if spans == "region":
        return len({g.region for g in rows})
    if spans == "zone":
        common = set(_zones(rows[0]))
        for g in rows[1:]:
            common &= set(_zones(g))
        return 1 if common else 2
    return 1


def apply_crossing(specs: list[Any], rows: Sequence[GpuType], link_gbps: float | None) -> None:
    """Cap each row's network at a crossing's link of ``link_gbps`` Gbit/s per instance
    (core GpuSpec objects, in place); ``None``: no crossing."""
    if link_gbps is None:
        return
    for s, g in zip(specs, rows, strict=True):
        s.inter_node_gbs = min(s.inter_node_gbs, link_gbps / 8.0 / g.gpus_per_node)
