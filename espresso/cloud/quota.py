"""Availability as an input: quotas per provider / region / instance type, and a cap on the
instances of any one offer.

Quota file (YAML or JSON)::

    quotas:                       # first matching entry wins; fields left out match anything
      - {provider: aws, region: us-east-1, instance_type: p5.48xlarge, instances: 2}
      - {provider: aws, instance_type: "g6e.*", instances: 4}   # shell patterns
      - {provider: aws, market: spot, instances: 8, interruptions_per_hour: 0.02}
      - {provider: lambda, instances: 0}
    default: 0                    # offers no entry matches (omit: keep the catalog's)

``market`` (``on-demand`` or ``spot``) matches the rows ``--spot`` adds; an entry may set a
spot row's ``interruptions_per_hour`` and ``recovery_hours`` (hours to replace an instance)
besides, or instead of, its ``instances``.

Limits shared by several offers, as the clouds enforce them (each applies per region: one
pool of the given size in every region it matches; the first limit matching an offer wins)::

    limits:
      - {provider: aws, family: P, vcpus: 384}   # Running On-Demand P instances
      - {provider: aws, family: G, market: spot, vcpus: 192}   # All G and VT Spot Requests
      - {provider: gcp, gpu: H100-SXM, gpus: 16}   # NVIDIA_H100_GPUS
      - {provider: gcp, gpu: H100-SXM, market: spot, gpus: 8}   # PREEMPTIBLE_NVIDIA_H100_GPUS
      - {provider: lambda, instance_type: "gpu_8x_*", instances: 2}

``family`` is AWS's instance family group (P, G, DL, Inf, Trn: the instance types whose
name begins so, G with VT). ``vcpus`` counts each instance's vCPUs (AWS instance types of
size ``Nxlarge`` have 4N), ``gpus`` its GPUs, ``instances`` one each.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import _validate as v
from ..catalog import ASSUMPTION_NOTE, Catalog, GpuType, without_stale_assumption
from ..errors import CatalogError

_FIELDS = ("provider", "region", "instance_type", "gpu", "market")
_SETS = ("instances", "interruptions_per_hour", "recovery_hours")
_UNITS = ("vcpus", "gpus", "instances")
FAMILIES = {"p": ("p*",), "g": ("g*", "vt*"), "dl": ("dl*",), "inf": ("inf*",),
            "trn": ("trn*",)}
"""AWS's instance family groups (their On-Demand and Spot vCPU quotas) as instance-type
patterns."""


def vcpus_of(g: GpuType) -> int:
    """vCPUs of one instance of ``g``: the row's own figure (SkyPilot's vCPUs column), else
    4N for an AWS instance type of size ``Nxlarge`` (true of every such GPU instance type in
    SkyPilot's AWS catalog); otherwise not known."""
    if g.vcpus is not None:
        return g.vcpus
    m = re.fullmatch(r"[a-z0-9-]+\.(\d*)xlarge", g.instance_type or "")
    if g.provider == "aws" and m:
        return 4 * int(m.group(1) or 1)
    msg = (f"quota limits: the vCPUs of {g.name} are not known (the catalog gives none, and it "
           "is not an AWS instance type of size Nxlarge); limit it by gpus or instances, or "
           "give the offer's vcpus")
    raise CatalogError(msg)


def _values(g: GpuType) -> dict[str, str]:
    """What a quota entry's patterns match a row by (``_FIELDS``)."""
    return {"provider": g.provider or "", "region": g.region or "",
            "instance_type": g.instance_type or g.name, "gpu": g.model, "market": g.market}


def _matches(values: dict[str, str], pats: dict[str, str]) -> bool:
    return all(fnmatch.fnmatchcase(values[f], p) for f, p in pats.items())


def _limits(rows: list[GpuType], entries: Any) -> dict[str, tuple[str, float, float, str]]:
    """Row name -> (pool name, units per instance, pool limit, words) for the rows the
    ``limits:`` entries cover (the first matching entry wins; one pool per region)."""
    if not isinstance(entries, list):
        msg = f"quota.limits: expected a list of entries, got {entries!r}"
        raise CatalogError(msg)
    rules = []
    for i, e in enumerate(entries):
        where = f"quota.limits[{i}]"
        e = v.mapping(where, e, err=CatalogError)
        v.known_keys(where, e, (*_FIELDS, "family", *_UNITS), (), err=CatalogError)
        units = [u for u in _UNITS if u in e]
        if len(units) != 1:
            msg = f"{where}: expected exactly one of {', '.join(_UNITS)}, got {e!r}"
            raise CatalogError(msg)
        unit = units[0]
        cap = v.integer(f"{where}.{unit}", e[unit], minimum=0, maximum=1 << 40,
                        err=CatalogError)
        pats = {f: v.string(f"{where}.{f}", e[f], err=CatalogError) for f in _FIELDS if f in e}
        family = None
        if "family" in e:
            family = v.choice(f"{where}.family", e["family"], tuple(FAMILIES),
                              err=CatalogError)
        rules.append((i, pats, family, unit, cap))
    out: dict[str, tuple[str, float, float, str]] = {}
    used = set()
    for g in rows:
        values = _values(g)
        for i, pats, family, unit, cap in rules:
            if not _matches(values, pats):
                continue
            if family is not None and not any(fnmatch.fnmatchcase(values["instance_type"], p)
                                              for p in FAMILIES[family]):
                continue
            per = (vcpus_of(g) if unit == "vcpus" else g.gpus_per_node if unit == "gpus"
                   else 1)
            what = ", ".join([f"{f} {p}" for f, p in pats.items()]
                             + ([f"family {family.upper()}"] if family else []))
            pool = f"limits[{i}] {g.provider or 'local'}/{g.region or '-'}"
            out[g.name] = (pool, float(per), float(cap),
                           f"quota file limit {i + 1} ({what}: {cap} {unit} in "
                           f"{g.region or 'its location'}, shared)")
            used.add(i)
            break
    unused = [i for i, *_ in rules if i not in used]
    if unused:
        msg = (f"quota.limits[{unused[0]}] matches no offer of the catalog "
               f"({entries[unused[0]]!r}); check the provider, region, family and GPU")
        raise CatalogError(msg)
    return out


def _set_instances(g: GpuType, n: int, why: str) -> GpuType:
    return replace(g, count=n * g.gpus_per_node, availability=why)


def _pooled(g: GpuType, pool: str, per: float, cap: float, words: str) -> GpuType:
    """Row ``g`` under a shared limit. An assumed count gives way to the limit (the most
    instances it allows alone); a count a quota entry or ``--max-instances`` set stays, and
    both bind."""
    assumed = g.availability is not None and g.availability.startswith("assumed:")
    if assumed:
        alone = min(int(cap // per), 1 << 30) if per > 0 else g.instances
        g = replace(g, count=alone * g.gpus_per_node)
    elif g.availability:
        words += f"; {g.availability}"
    return replace(g, pool=pool, pool_units=per, pool_limit=cap, availability=words)


def apply_quota(catalog: Catalog, quota: Any) -> Catalog:
    """The catalog with each offer's instances set by the quota (a mapping as above)."""
    data = v.mapping("quota", quota, err=CatalogError)
    v.known_keys("quota", data, ("quotas", "limits", "default"), (), err=CatalogError)
    entries = data.get("quotas", [])
    if not isinstance(entries, list):
        msg = f"quota.quotas: expected a list of entries, got {entries!r}"
        raise CatalogError(msg)
    rules = []
    for i, e in enumerate(entries):
        e = v.mapping(f"quota.quotas[{i}]", e, err=CatalogError)
        v.known_keys(f"quota.quotas[{i}]", e, (*_FIELDS, *_SETS), (), err=CatalogError)
        if not any(k in e for k in _SETS):
            msg = (f"quota.quotas[{i}]: expected at least one of {', '.join(_SETS)}, "
                   f"got {e!r}")
            raise CatalogError(msg)
        sets: dict[str, Any] = {}
        if "instances" in e:
            sets["instances"] = v.integer(f"quota.quotas[{i}].instances", e["instances"],
                                          minimum=0, maximum=1 << 30, err=CatalogError)
        for f, top in (("interruptions_per_hour", 1e3), ("recovery_hours", 1e4)):
            if f in e:
                sets[f] = v.number(f"quota.quotas[{i}].{f}", e[f], minimum=0, maximum=top,
                                   err=CatalogError)
        pats = {f: v.string(f"quota.quotas[{i}].{f}", e[f], err=CatalogError)
                for f in _FIELDS if f in e}
        rules.append((pats, sets, i))
    default = data.get("default")
    if default is not None:
        default = v.integer("quota.default", default, minimum=0, maximum=1 << 30,
                            err=CatalogError)
    used = set()
    rows = []
    for g in catalog.gpus:
        values = _values(g)
        for pats, sets, i in rules:
            if _matches(values, pats):
                row = g
                if "instances" in sets:
                    row = _set_instances(g, sets["instances"], f"quota file entry {i + 1} ("
                                         + ", ".join(f"{f} {p}" for f, p in pats.items())
                                         + f": {sets['instances']} instances each)")
                spot = {k: val for k, val in sets.items() if k != "instances"}
                rows.append(replace(row, **spot) if spot else row)
                used.add(i)
                break
        else:
            rows.append(g if default is None else
                        _set_instances(g, default, f"quota file default ({default} instances)"))
    unused = [i for _, _, i in rules if i not in used]
    if unused:
        msg = (f"quota.quotas[{unused[0]}] matches no offer of the catalog "
               f"({entries[unused[0]]!r}); check the provider, region and instance type")
        raise CatalogError(msg)
    if "limits" in data:
        pools = _limits(rows, data["limits"])
        rows = [g if g.name not in pools else _pooled(g, *pools[g.name]) for g in rows]
    notes = [*without_stale_assumption(catalog.notes, rows),
             "availability from a quota file" + (f" (default {default} instances)"
                                                 if default is not None else
                                                 "; offers no entry matches keep their own")]
    return Catalog(gpus=tuple(rows), notes=tuple(notes))


def load_quota(catalog: Catalog, path: str | Path) -> Catalog:
    """:func:`apply_quota` with a quota file."""
    data = v.load_yaml("--quota", path, err=CatalogError)
    try:
        return apply_quota(catalog, data)
    except CatalogError as exc:
        msg = f"{path}: {exc}"
        raise CatalogError(msg) from None


def max_instances(catalog: Catalog, n: int) -> Catalog:
    """The catalog with at most ``n`` instances of each offer."""
    n = v.integer("max_instances", n, minimum=0, maximum=1 << 30, err=CatalogError)
    rows = tuple(g if g.instances <= n else _set_instances(g, n, f"--max-instances {n}")
                 for g in catalog.gpus)
    notes = [m for m in catalog.notes if not m.startswith(ASSUMPTION_NOTE)]
    still = [g for g in rows if (g.availability or "").startswith("assumed:")]
    notes.append(f"availability: at most {n} instances of each offer (--max-instances)" + (
        f"; {len(still)} offers keep the fewer instances assumed without a quota "
        "(32 GPUs per offer)" if still else ""))
    return Catalog(gpus=rows, notes=tuple(notes))
