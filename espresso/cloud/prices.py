"""Price sanity: offers priced far below what the same GPU costs elsewhere in the catalog.

A plan that rents such an offer depends on a price the user should check before renting (a
stale catalog row, a region whose spot market has no history, a typo in a CSV). Two rules,
each on the price per GPU-hour (docs/catalog.md, "Price sanity"):

* against its peers: under :data:`PEER_FRACTION` of what the same GPU typically costs in the
  same market (on demand or spot), when it has at least :data:`MIN_PEERS` other offers there.
  "Typically" is the (lower) median over providers of each provider's median price, so that one
  provider listing the GPU in thirty regions does not outvote the others (a neo-cloud's
  V100 is not an outlier because AWS sells p3 in every region at six times its price);
* a spot row against its own on-demand price: under :data:`SPOT_FLOOR` of it.

The notes are computed once per catalog and travel in the plan's rent list (``price_note``).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

PEER_FRACTION = 1 / 3
"""An offer under this fraction of the median of its peers is an outlier."""
MIN_PEERS = 3
"""Fewer peers than this say nothing about a price."""
SPOT_FLOOR = 0.15
"""A spot price under this fraction of the same offer's on-demand price is an outlier: AWS
advertises discounts of "up to 90%" (0.10), and in the shipped snapshot that floor occurs
for whole regions at once (every ap-southeast-3 spot row sits at exactly 0.10)."""
SPOT_SUFFIX = ":spot"

_CACHE: dict[int, tuple[Any, dict[str, str]]] = {}
_CACHE_SIZE = 8


def _usd(x: float) -> str:
    return f"${x:,.2f}" if x >= 0.1 else f"${x:.3f}"


def price_notes(catalog: Any) -> dict[str, str]:
    """Row name -> why its price is suspicious, for the rows of ``catalog`` that are."""
    hit = _CACHE.get(id(catalog))
    if hit is not None and hit[0] is catalog:
        return hit[1]
    rows = list(catalog)
    peers: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for g in rows:
        peers[(g.model, g.market)][g.provider or ""].append(g.price_per_hour)
    # Each provider's median once per (GPU, market); a row recomputes only its own
    # provider's, without itself.
    medians = {key: {prov: statistics.median(v) for prov, v in by.items()}
               for key, by in peers.items()}
    by_name = {g.name: g for g in rows}
    out: dict[str, str] = {}
    for g in rows:
        p = g.price_per_hour
        if p <= 0:
            continue
        said = []
        key, own = (g.model, g.market), g.provider or ""
        mine = list(peers[key][own])
        mine.remove(p)
        n_others = sum(len(v) for v in peers[key].values()) - 1
        if n_others >= MIN_PEERS:
            typical = [m for prov, m in medians[key].items() if prov != own]
            if mine:
                typical.append(statistics.median(mine))
            # (the lower median: between two providers, the cheaper one's price is typical)
            med = statistics.median(typical) if len(typical) == 1 else \
                statistics.median_low(typical)
            if p < PEER_FRACTION * med:
                what = (f"the median ({_usd(med)})" if len(typical) == 1 else
                        f"the typical price ({_usd(med)}: the median of {len(typical)} "
                        "providers' medians)")
                said.append(f"{p / med:.2f}x {what} of {n_others} other {g.model} "
                            f"{g.market} offers")
        if g.market == "spot" and g.name.endswith(SPOT_SUFFIX):
            base = by_name.get(g.name.removesuffix(SPOT_SUFFIX))
            if base is not None and base.price_per_hour > 0 and \
                    p < SPOT_FLOOR * base.price_per_hour:
                said.append(f"{p / base.price_per_hour:.2f}x its on-demand price "
                            f"({_usd(base.price_per_hour)}; spot discounts reach 90%)")
        if said:
            where = f"{g.instance_label}{' (spot)' if g.market == 'spot' else ''}" + (
                f" in {g.provider} {g.region}" if g.provider else "")
            out[g.name] = (f"{where} at {_usd(p)}/GPU-h is " + " and ".join(said)
                           + ": the plan rests on it; check it before renting")
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[id(catalog)] = (catalog, out)
    return out
