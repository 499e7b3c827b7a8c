"""The resolved table: a catalog's rows as the native core computes with them.

One owner of everything a catalog row becomes before the core sees it: the row's native spec
(its offer and GPU spec joined, spot terms resolved: :mod:`espresso.gpu_type`), the measured
profiles that replace its analytic times (:mod:`espresso.profile`), and the network cap of a
plan that spans locations (:mod:`espresso.cloud.domains`). A :class:`Table` is resolved once
per (catalog, model, cost model, profiles); the search, the estimates of the plans it
returns and their interleavings all read the same one (docs/development.md, "The catalog's
path"). Quotas, spot rows and offers are resolved earlier, into the :class:`Catalog` itself.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from .catalog import Catalog
from .cloud.domains import apply_crossing
from .cost import CostParams
from .errors import CatalogError, SpecError
from .model import ModelSpec
from .profile import Profile

__all__ = ["Table"]


class Table:
    """``catalog``'s rows resolved for ``model`` under ``cost`` with ``profiles`` (``{GPU
    model: Profile}``, already normalised by :func:`espresso.profile.as_profiles`)."""

    __slots__ = ("_pool_index", "_specs", "catalog", "cost", "model", "pools", "profiles")

    def __init__(self, catalog: Catalog, model: ModelSpec, cost: CostParams,
                 profiles: Mapping[str, Profile] | None = None) -> None:
        if not isinstance(catalog, Catalog):
            msg = f"catalog: expected a Catalog, got {type(catalog).__name__}"
            raise SpecError(msg)
        self.catalog = catalog
        self.model = model
        self.cost = cost
        self.profiles = dict(profiles or {})
        if self.profiles:
            models = {g.model for g in catalog}
            for gpu in self.profiles:
                if gpu not in models:
                    catalog.index(gpu)  # an unknown GPU type is an error, not ignored
        # Row index -> its native spec, resolved on first use: a search over a catalog of
        # thousands of offers touches only the rows of the subproblems it prepares.
        self._specs: dict[int, Any] = {}
        # Limits shared by several rows (GpuType.pool): their capacities, by index.
        self.pools: list[float] = []
        self._pool_index: dict[str, int] = {}
        for g in catalog:
            if g.pool is None:
                continue
            i = self._pool_index.get(g.pool)
            if i is None:
                self._pool_index[g.pool] = len(self.pools)
                self.pools.append(float(g.pool_limit or 0.0))
            elif self.pools[i] != g.pool_limit:
                msg = (f"gpu {g.name!r}: pool {g.pool!r} has the limit {g.pool_limit:g} here "
                       f"but {self.pools[i]:g} on another row; a pool has one limit")
                raise CatalogError(msg)

    def spec(self, i: int) -> Any:
        """Row ``i``'s native spec, profiles applied. Shared: copy it before changing it."""
        s = self._specs.get(i)
        if s is None:
            row = self.catalog.gpus[i]
            s = row._spec()
            if row.pool is not None:
                s.pool = self._pool_index[row.pool]
                s.pool_units = float(row.pool_units or 0.0)
            prof = self.profiles.get(row.model)  # a profile is of a GPU model, wherever rented
            if prof is not None:
                for k, val in prof.factors(self.model, row, self.cost).items():
                    setattr(s, k, val)
            self._specs[i] = s
        return s

    def specs(self, rows: Sequence[int], link_gbps: float | None = None) -> list[Any]:
        """Fresh native specs of ``rows`` (indices), each row's network capped at a crossing's
        ``link_gbps`` Gbit/s per instance when the plan spans locations (``None``: none)."""
        out = [copy.copy(self.spec(i)) for i in rows]
        apply_crossing(out, [self.catalog.gpus[i] for i in rows], link_gbps)
        return out

    def serves(self, model: ModelSpec, cost: CostParams, profiles: Mapping[str, Profile],
               gpus: Sequence[str]) -> bool:
        """This table resolves rows of GPU models ``gpus`` exactly as a fresh one for
        ``model``, ``cost`` and ``profiles`` would."""
        return ((model is self.model or model == self.model)
                and (cost is self.cost or cost == self.cost)
                and all(profiles.get(g) == self.profiles.get(g) for g in gpus))
