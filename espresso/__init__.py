"""Espresso: cost-efficient plans for training large transformers on heterogeneous GPUs.

>>> import espresso
>>> plan = espresso.Plan.from_json("plan.json")          # doctest: +SKIP
>>> est = espresso.estimate(plan)                        # doctest: +SKIP
"""

from __future__ import annotations

from .catalog import Catalog, GpuType
from .cost import CostParams
from .errors import (
    CatalogError,
    EspressoError,
    JobError,
    MissingExtraError,
    ModelError,
    PlanError,
    ProfileError,
    SpecError,
)
from .estimate import estimate
from .estimate_result import Estimate, SpotEstimate, StageEstimate
from .frontier import Frontier, FrontierPoint, frontier
from .job import Job
from .model import ModelSpec
from .plan import Plan, Stage
from .profile import Profile
from .progress import SearchProgress
from .search import InfeasibleError, SearchResult, SearchStats, place, plan, search
from .units import parse_count, parse_hours

__version__ = "0.1.0"

__all__ = [
    "Catalog",
    "CatalogError",
    "CostParams",
    "EspressoError",
    "Estimate",
    "Frontier",
    "FrontierPoint",
    "GpuType",
    "InfeasibleError",
    "Job",
    "JobError",
    "MissingExtraError",
    "ModelError",
    "ModelSpec",
    "Plan",
    "PlanError",
    "Profile",
    "ProfileError",
    "SearchProgress",
    "SearchResult",
    "SearchStats",
    "SpecError",
    "SpotEstimate",
    "Stage",
    "StageEstimate",
    "estimate",
    "frontier",
    "parse_count",
    "parse_hours",
    "place",
    "plan",
    "search",
]
