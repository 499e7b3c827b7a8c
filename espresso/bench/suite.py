"""Benchmark suites: a YAML file naming models, catalogs, training lengths, deadlines and
quotas, expanded into cells (every combination) that Espresso and each baseline plan.

The format (docs/benchmarks.md)::

    name: paper
    description: four public models over the cloud snapshot, 2 instances per offer
    seq_len: 4096                 # job defaults for every cell
    global_batch_size: 512
    catalogs:                     # name -> catalog, as --catalog/--quota/--max-instances
      cloud-2: {catalog: builtin:cloud, max_instances: 2}
    quotas: {none: null}          # name -> quota file (null: none); another axis
    tokens: [2e10]                # or iterations: [...]
    deadlines: [7d, 3d]
    models:                       # a preset name or file, or a mapping overriding the axes
      - llama2-7b
      - {model: llama2-70b, tokens: [1e11], deadlines: [60d, 45d]}
    baselines: all                # or a list of names (espresso.baselines.BASELINES, and
                                  # EXTERNAL_BASELINES by name only)
    search: {time_limit_s: 60}    # search options for every planner
    frontier: {max_points: 8}     # optional: Espresso's exact frontier per model and catalog

Relative file paths are read from the suite file's folder.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import _validate as v
from ..baselines import BASELINES, EXTERNAL_BASELINES
from ..catalog import Catalog
from ..cloud.quota import load_quota, max_instances
from ..engines import ENGINES
from ..errors import SpecError
from ..job import Job
from ..model import ModelSpec
from ..units import parse_count, parse_hours

SUITE_KEYS = ("name", "description", "seq_len", "global_batch_size", "catalogs", "quotas",
              "tokens", "iterations", "deadlines", "models", "baselines", "search", "frontier")
MODEL_KEYS = ("model", "name", "tokens", "iterations", "deadlines", "seq_len",
              "global_batch_size")
CATALOG_KEYS = ("catalog", "quota", "max_instances")
SEARCH_KEYS = ("time_limit_s", "max_stages", "max_tp", "micro_batch_sizes", "recompute",
               "sharding", "max_gpu_types", "schedule", "interleave_after", "engine")
FRONTIER_KEYS = ("max_points", "time_limit_s")
MAX_CELLS = 10_000
"""A suite expands to at most this many cells."""


@dataclass(frozen=True, slots=True)
class CatalogSpec:
    """A named catalog of a suite: ``catalog`` as ``--catalog`` takes it, with a quota file
    and an instance cap."""

    name: str
    catalog: str = "builtin:cloud"
    quota: str | None = None
    max_instances: int | None = None

    def load(self, quota: str | None = None) -> Catalog:
        """The catalog with its own quota, then the suite's ``quota`` axis, then the cap."""
        cat = Catalog.open(self.catalog)
        for q in (self.quota, quota):
            if q is not None:
                cat = load_quota(cat, q)
        if self.max_instances is not None:
            cat = max_instances(cat, self.max_instances)
        return cat


@dataclass(frozen=True, slots=True)
class Cell:
    """One job on one catalog under one quota: every planner plans it."""

    index: int
    model: str
    """The preset name or model file."""
    model_name: str
    catalog: str
    """The suite's name of the catalog."""
    quota: str
    """The suite's name of the quota (``none``)."""
    tokens: int | None
    iterations: int | None
    deadline_hours: float
    seq_len: int
    global_batch_size: int

    def job(self) -> Job:
        model = (ModelSpec.load(self.model) if self.model.endswith((".yaml", ".yml", ".json"))
                 else ModelSpec.preset(self.model))
        return Job(model=model, deadline_hours=self.deadline_hours, seq_len=self.seq_len,
                   global_batch_size=self.global_batch_size, tokens=self.tokens,
                   iterations=self.iterations)

    @property
    def group(self) -> tuple[str, str, str, int | None, int | None, int, int]:
        """Cells that differ only in the deadline (one cost-deadline curve)."""
        return (self.model_name, self.catalog, self.quota, self.tokens, self.iterations,
                self.seq_len, self.global_batch_size)


@dataclass(frozen=True, slots=True)
class Suite:
    name: str
    description: str
    cells: tuple[Cell, ...]
    catalogs: dict[str, CatalogSpec]
    quotas: dict[str, str | None]
    baselines: tuple[str, ...]
    search: dict[str, Any] = field(default_factory=dict)
    frontier: dict[str, Any] | None = None
    path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """What the suite ran, for the results folder (``suite.json``)."""
        return {"name": self.name, "description": self.description, "path": self.path,
                "catalogs": {k: {"catalog": c.catalog, "quota": c.quota,
                                 "max_instances": c.max_instances}
                             for k, c in self.catalogs.items()},
                "quotas": self.quotas, "baselines": list(self.baselines),
                "search": self.search, "frontier": self.frontier,
                "cells": len(self.cells)}


def _list(field_: str, value: Any) -> list[Any]:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return [value]
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        msg = f"{field_}: expected a value or a non-empty list, got {value!r}"
        raise SpecError(msg)
    return list(value)


def _path(base: Path | None, p: str) -> str:
    if base is None or p.startswith(("builtin:", "skypilot:")) or Path(p).is_absolute():
        return p
    return str(base / p)


def _catalogs(data: Any, base: Path | None) -> dict[str, CatalogSpec]:
    if data is None:
        return {"cloud": CatalogSpec("cloud")}
    data = v.mapping("suite.catalogs", data)
    if not data:
        msg = "suite.catalogs: expected at least one catalog, got {}"
        raise SpecError(msg)
    out: dict[str, CatalogSpec] = {}
    for name, spec in data.items():
        where = f"suite.catalogs.{name}"
        if isinstance(spec, str):
            spec = {"catalog": spec}
        spec = v.mapping(where, spec)
        v.known_keys(where, spec, CATALOG_KEYS)
        cat = v.string(f"{where}.catalog", spec.get("catalog", "builtin:cloud"))
        quota = spec.get("quota")
        cap = spec.get("max_instances")
        out[str(name)] = CatalogSpec(
            name=str(name), catalog=_path(base, cat),
            quota=None if quota is None else _path(base, v.string(f"{where}.quota", quota)),
            max_instances=None if cap is None else v.integer(f"{where}.max_instances", cap,
                                                             minimum=0, maximum=1 << 20))
    return out


def _quotas(data: Any, base: Path | None) -> dict[str, str | None]:
    if data is None:
        return {"none": None}
    data = v.mapping("suite.quotas", data)
    if not data:
        msg = "suite.quotas: expected at least one entry (name: file, or name: null)"
        raise SpecError(msg)
    return {str(k): None if f is None else _path(base, v.string(f"suite.quotas.{k}", f))
            for k, f in data.items()}


def _lengths(where: str, data: Mapping[str, Any], default: tuple[str, list[Any]] | None
             ) -> tuple[str, list[int]]:
    if "tokens" in data and "iterations" in data:
        msg = f"{where}: give tokens or iterations, not both"
        raise SpecError(msg)
    for key in ("tokens", "iterations"):
        if key in data:
            vals = _list(f"{where}.{key}", data[key])
            return key, [parse_count(x, f"{where}.{key}[{i}]") for i, x in enumerate(vals)]
    if default is None:
        msg = f"{where}: missing tokens (or iterations): the training length"
        raise SpecError(msg)
    return default[0], list(default[1])


def load_suite(path: str | Path) -> Suite:
    """Read and check a suite file (errors name the field, the value and what was
    expected)."""
    p = Path(path)
    data = v.load_yaml("benchmark suite", p)
    return suite_from_dict(data, base=p.resolve().parent, path=str(p))


def suite_from_dict(data: Any, *, base: Path | None = None, path: str | None = None) -> Suite:
    data = v.mapping("suite", data)
    v.known_keys("suite", data, SUITE_KEYS, ("models",))
    name = v.string("suite.name", data.get("name", Path(path).stem if path else "suite"))
    seq = v.integer("suite.seq_len", data.get("seq_len", 4096), minimum=1, maximum=1 << 24)
    gbs = v.integer("suite.global_batch_size", data.get("global_batch_size", 512), minimum=1,
                    maximum=1 << 30)
    catalogs = _catalogs(data.get("catalogs"), base)
    quotas = _quotas(data.get("quotas"), base)
    top_len = (_lengths("suite", data, None)
               if "tokens" in data or "iterations" in data else None)
    top_deadlines = data.get("deadlines")
    raw_b = data.get("baselines", "all")
    if raw_b == "all":
        baselines = tuple(BASELINES)
    elif raw_b in (None, "none"):
        baselines = ()
    else:
        baselines = tuple(v.choice(f"suite.baselines[{i}]", b,
                                   (*BASELINES, *EXTERNAL_BASELINES))
                          for i, b in enumerate(_list("suite.baselines", raw_b)))
    search = dict(v.mapping("suite.search", data.get("search") or {}))
    v.known_keys("suite.search", search, SEARCH_KEYS)
    if "engine" in search:
        search["engine"] = v.choice("suite.search.engine", search["engine"], tuple(ENGINES))
    if "time_limit_s" in search:
        search["time_limit_s"] = v.number("suite.search.time_limit_s", search["time_limit_s"],
                                          positive=True, maximum=86_400)
    frontier = data.get("frontier")
    if frontier is not None:
        frontier = dict(v.mapping("suite.frontier", frontier))
        v.known_keys("suite.frontier", frontier, FRONTIER_KEYS)
        frontier["max_points"] = v.integer("suite.frontier.max_points",
                                           frontier.get("max_points", 8), minimum=1,
                                           maximum=1000)
        frontier["time_limit_s"] = v.number("suite.frontier.time_limit_s",
                                            frontier.get("time_limit_s", 120), positive=True,
                                            maximum=86_400)
    models = _list("suite.models", data["models"])
    cells: list[Cell] = []
    for i, m in enumerate(models):
        where = f"suite.models[{i}]"
        spec = {"model": m} if isinstance(m, str) else dict(v.mapping(where, m))
        v.known_keys(where, spec, MODEL_KEYS, ("model",))
        model = v.string(f"{where}.model", spec["model"])
        if model.endswith((".yaml", ".yml", ".json")):
            model = _path(base, model)
            model_name = spec.get("name") or ModelSpec.load(model).name
        else:
            known = ModelSpec.preset_names()
            if model not in known:
                msg = (f"{where}.model: unknown preset {model!r}{v.suggest(model, known)} "
                       f"(known: {', '.join(known)}; or a model file)")
                raise SpecError(msg)
            model_name = spec.get("name") or model
        kind, lengths = _lengths(where, spec, (top_len[0], top_len[1]) if top_len else None)
        raw_d = spec.get("deadlines", top_deadlines)
        if raw_d is None:
            msg = f"{where}: missing deadlines (here or at the top of the suite)"
            raise SpecError(msg)
        deadlines = [parse_hours(d, f"{where}.deadlines[{k}]")
                     for k, d in enumerate(_list(f"{where}.deadlines", raw_d))]
        m_seq = v.integer(f"{where}.seq_len", spec.get("seq_len", seq), minimum=1,
                          maximum=1 << 24)
        m_gbs = v.integer(f"{where}.global_batch_size", spec.get("global_batch_size", gbs),
                          minimum=1, maximum=1 << 30)
        for cat, quota, n, dl in itertools.product(catalogs, quotas, lengths, deadlines):
            if len(cells) >= MAX_CELLS:
                msg = f"suite: more than {MAX_CELLS} cells; split the suite"
                raise SpecError(msg)
            cells.append(Cell(index=len(cells), model=model, model_name=str(model_name),
                              catalog=cat, quota=quota,
                              tokens=n if kind == "tokens" else None,
                              iterations=n if kind == "iterations" else None,
                              deadline_hours=dl, seq_len=m_seq, global_batch_size=m_gbs))
    for c in cells:
        c.job()  # a bad job fails here, before anything runs
    return Suite(name=name, description=str(data.get("description", "")), cells=tuple(cells),
                 catalogs=catalogs, quotas=quotas, baselines=baselines, search=search,
                 frontier=frontier, path=path)
