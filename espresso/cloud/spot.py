"""Spot capacity: the market as a choice per offer.

A catalog row is bought on demand or on the spot market. :func:`with_spot` adds, for every
row that has a spot price, a spot row beside it (``<name>:spot``) that the search may choose
instead of or together with the on-demand one; the cost model then prices a plan's spot
instances by their expected hours (interruptions, checkpoints, restarts) and requires the
deadline to hold with ``Job.deadline_confidence`` (docs/cost-model.md, "Spot capacity").

The interruption defaults (:mod:`espresso.cloud.spot_terms`, re-exported here) are what
providers publish; they vary by an order of magnitude or more
between instance types, zones and months, so ``--spot-rate`` (or a quota file's
``interruptions_per_hour``) should carry your own history when you have one.
"""

from __future__ import annotations

from dataclasses import replace

from .. import _validate as v
from ..catalog import Catalog, GpuType
from ..errors import CatalogError
from .spot_terms import GENERIC_DEFAULTS, SPOT_DEFAULTS, SpotDefaults, spot_defaults

__all__ = ["GENERIC_DEFAULTS", "SPOT_DEFAULTS", "SPOT_SUFFIX", "SpotDefaults", "spot_defaults",
           "spot_row", "with_spot"]

SPOT_SUFFIX = ":spot"
"""Spot rows are named after their on-demand row with this suffix."""


def spot_row(g: GpuType, *, rate: float | None = None,
             recovery_hours: float | None = None) -> GpuType:
    """The spot counterpart of on-demand row ``g`` (it must have a spot price)."""
    if g.spot_price_per_hour is None:
        msg = f"gpu {g.name!r}: no spot_price_per_hour, so no spot row can be made"
        raise CatalogError(msg)
    # (spot capacity is a separate pool: an on-demand row's shared limit is not the spot one's)
    return replace(g, name=g.name + SPOT_SUFFIX, gpu=g.model, market="spot",
                   pool=None, pool_units=None, pool_limit=None,
                   price_per_hour=g.spot_price_per_hour, spot_price_per_hour=None,
                   interruptions_per_hour=g.interruptions_per_hour if rate is None else rate,
                   recovery_hours=g.recovery_hours if recovery_hours is None else recovery_hours)


def with_spot(catalog: Catalog, *, only: bool = False, rate: float | None = None,
              recovery_hours: float | None = None) -> Catalog:
    """The catalog with a spot row beside every on-demand row that has a spot price.

    ``only``: drop the on-demand rows (spot plans only). ``rate`` / ``recovery_hours``:
    interruptions per instance-hour and hours to replace an instance for every spot row
    (default: each provider's, :data:`SPOT_DEFAULTS`). A spot row's availability is its
    on-demand row's (spot and on-demand capacity are separate pools; a quota file sets each:
    ``market: spot``)."""
    if rate is not None:
        rate = v.number("--spot-rate", rate, minimum=0, maximum=1e3, err=CatalogError)
    if recovery_hours is not None:
        recovery_hours = v.number("--spot-recovery", recovery_hours, minimum=0, maximum=1e4,
                                  err=CatalogError)
    rows: list[GpuType] = []
    added = 0
    names = set(catalog.names)
    for g in catalog.gpus:
        if g.market == "spot":
            rows.append(g if rate is None and recovery_hours is None else
                        replace(g, interruptions_per_hour=rate if rate is not None
                                else g.interruptions_per_hour,
                                recovery_hours=recovery_hours if recovery_hours is not None
                                else g.recovery_hours))
            continue
        if not only:
            rows.append(g)
        if g.spot_price_per_hour is not None and g.name + SPOT_SUFFIX not in names:
            rows.append(spot_row(g, rate=rate, recovery_hours=recovery_hours))
            added += 1
    if not rows:
        msg = ("catalog: no row has a spot price, so a spot-only catalog is empty "
               "(spot prices come with the cloud snapshot and SkyPilot catalogs)")
        raise CatalogError(msg)
    if added == 0 and not any(g.market == "spot" for g in rows):
        msg = ("catalog: no row has a spot price (`spot_price_per_hour`); spot planning "
               "needs one (the cloud snapshot and SkyPilot catalogs carry them)")
        raise CatalogError(msg)
    note = (f"spot rows added for {added} offers" if not only else
            f"spot rows only ({added} offers)")
    if rate is not None:
        note += f", {rate:g} interruptions per instance-hour"
    else:
        note += ", interruption rates: provider defaults (docs/cost-model.md, \"Spot capacity\")"
    return Catalog(gpus=tuple(rows), notes=(*catalog.notes, note))
