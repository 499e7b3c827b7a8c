"""Spot interruption terms: what providers publish about reclaimed instances.

The defaults a spot row takes when it carries no rate of its own (docs/cost-model.md, "Spot
capacity"); :mod:`espresso.cloud.spot` adds the spot rows themselves.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SpotDefaults:
    """Default interruption terms of one provider's spot instances."""

    interruptions_per_hour: float
    """Interruptions per instance-hour."""
    recovery_hours: float
    """Hours until a reclaimed instance is replaced (new capacity granted and booted)."""
    source: str


# Google: "the average preemption rate varies between 5% and 15% per day per project, on a
# seven-day average" (Compute Engine, preemptible VM instances); we take the upper end,
# 0.15 / 24 h. AWS publishes only monthly buckets (Spot Instance Advisor: <5% ... >20% of
# instances interrupted in the trailing month, GPU types mostly in the open top bucket), and
# SkyPilot's p3.2xlarge traces (Wu et al., NSDI'24) measured lifetimes of 1-3 hours: no
# single figure holds, so AWS (and any other provider) gets Google's figure as well.
# Recovery (capacity back and booted) is an assumption: 15 minutes.
_PUBLISHED_RATE = 0.15 / 24.0
_RECOVERY = 0.25

SPOT_DEFAULTS: dict[str, SpotDefaults] = {
    "gcp": SpotDefaults(_PUBLISHED_RATE, _RECOVERY,
                        "Google Cloud, preemptible VMs: 5-15% per day per project (upper end)"),
    "aws": SpotDefaults(_PUBLISHED_RATE, _RECOVERY,
                        "Google's published 15% per day (AWS publishes only monthly buckets)"),
}
GENERIC_DEFAULTS = SpotDefaults(_PUBLISHED_RATE, _RECOVERY,
                                "Google's published 15% per day (no figure for this provider)")


def spot_defaults(provider: str | None) -> SpotDefaults:
    """The interruption defaults for a provider's spot rows (``None``: a plain GPU row)."""
    return SPOT_DEFAULTS.get(provider or "", GENERIC_DEFAULTS)
