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
"""

from __future__ import annotations

import fnmatch
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import _validate as v
from ..catalog import ASSUMPTION_NOTE, Catalog, GpuType, without_stale_assumption
from ..errors import CatalogError

_FIELDS = ("provider", "region", "instance_type", "gpu", "market")
_SETS = ("instances", "interruptions_per_hour", "recovery_hours")


def _set_instances(g: GpuType, n: int, why: str) -> GpuType:
    return replace(g, count=n * g.gpus_per_node, availability=why)


def apply_quota(catalog: Catalog, quota: Any) -> Catalog:
    """The catalog with each offer's instances set by the quota (a mapping as above)."""
    data = v.mapping("quota", quota, err=CatalogError)
    v.known_keys("quota", data, ("quotas", "default"), (), err=CatalogError)
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
        values = {"provider": g.provider or "", "region": g.region or "",
                  "instance_type": g.instance_type or g.name, "gpu": g.model,
                  "market": g.market}
        for pats, sets, i in rules:
            if all(fnmatch.fnmatchcase(values[f], p) for f, p in pats.items()):
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
