"""Error types. Every message names the field, the value and what was expected."""

from __future__ import annotations


class EspressoError(Exception):
    """Base class of every error Espresso raises on purpose."""


class SpecError(EspressoError, ValueError):
    """A specification (GPU type, catalog, model, job, plan) is malformed."""


class CatalogError(SpecError):
    """A catalog or one of its GPU types is malformed, or a GPU name is unknown."""


class ModelError(SpecError):
    """A model specification is malformed or a preset is unknown."""


class JobError(SpecError):
    """A job specification is malformed."""


class PlanError(SpecError):
    """A plan is malformed (as opposed to well-formed but infeasible)."""


class ProfileError(SpecError):
    """A profile is malformed, or does not fit the model or GPU type it is applied to."""


class MissingExtraError(EspressoError, ImportError):
    """An optional dependency is not installed."""


class TrainError(EspressoError, ValueError):
    """A training run's settings or data are unusable (``espresso train``)."""
