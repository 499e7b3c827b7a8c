"""Real clouds: offers (an instance type of a provider in a region, at a price, with a
quota), the GPU spec table they join, SkyPilot catalogs, quotas, spot capacity, and the
network domains and vendors that split one catalog into the search's subproblems
(docs/catalog.md).

The modules sit on two floors (docs/development.md, "Layers"): below the catalog,
:mod:`~espresso.cloud.specs`, :mod:`~espresso.cloud.networks`,
:mod:`~espresso.cloud.spot_terms`, :mod:`~espresso.cloud.offers` and
:mod:`~espresso.cloud.skypilot` (the reader), which :mod:`espresso.catalog` builds rows from;
above it, :mod:`~espresso.cloud.quota`, :mod:`~espresso.cloud.spot`,
:mod:`~espresso.cloud.domains` and :mod:`~espresso.cloud.snapshot`, which work on catalogs, and
:mod:`~espresso.cloud.skypilot_export`, which writes plans as SkyPilot tasks. So this package
imports none of them itself: import the module you need.
"""
