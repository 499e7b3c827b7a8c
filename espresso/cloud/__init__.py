"""Real clouds: offers (an instance type of a provider in a region, at a price, with a
quota), the GPU spec table they join, SkyPilot catalogs, quotas, and the network domains and
vendors that split one catalog into the search's subproblems (docs/catalog.md)."""

from .domains import SCOPES, Subproblem, subproblems
from .offers import Offer, offer_key
from .quota import apply_quota, load_quota, max_instances
from .skypilot import SkyPilotRead, read_skypilot
from .specs import GpuSpec, SpecTable

__all__ = ["SCOPES", "GpuSpec", "Offer", "SkyPilotRead", "SpecTable", "Subproblem",
           "apply_quota", "load_quota", "max_instances", "offer_key", "read_skypilot",
           "subproblems"]
