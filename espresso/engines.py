"""Training engines and the plans each can run (``--engine``; docs/engines.md).

A plan is a layout; an engine is the software that runs it. Espresso's own runner
(``espresso train``, :mod:`espresso.runner`) runs every plan the search makes: stages of
different GPU types and tensor-parallel widths, any contiguous layer split, ZeRO-1/2 or FSDP,
interleaving. The engines people already use run fewer:

* **torchtitan** (PyTorch's reference trainer): one TP width for the whole model (its device
  mesh is ``pp x dp x tp``); any contiguous split (its ``module_fqns_per_model_part`` names
  each stage's modules); FSDP2 over the data-parallel ranks, resharding after the forward
  (``fsdp``) or not (``zero2``: ``reshard_after_forward = "never"``); plain data parallelism
  (DDP) only without pipeline and tensor parallelism; its schedules 1F1B, GPipe and
  interleaved 1F1B; full activation checkpointing, or its per-op selective checkpointing
  (``selective-op``: every other matmul's output and the attention kernel's saved), not
  espresso's attention-core-only ``selective``.
* **megatron** (Megatron-LM): one TP width; every pipeline stage but the first and the last
  holds the same number of layers (``--decoder-first-pipeline-num-layers`` and
  ``--decoder-last-pipeline-num-layers`` set those two), and interleaving needs equal chunks
  (``--num-layers-per-virtual-pipeline-stage``); the distributed optimizer shards optimizer
  states (ZeRO-1) and nothing more; 1F1B (its non-interleaved schedule) and interleaved 1F1B,
  no GPipe; full or selective recomputation (``selective``: the attention core).

The search restricts its space to what the engine runs (:meth:`Engine.restrict`,
``search(engine=...)``); :func:`runnable` says which engines can run a given plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from .cost import CostParams
from .errors import SpecError
from .plan import Plan

__all__ = ["ENGINES", "Engine", "engine_cost", "engine_named", "profile", "refusal",
           "runnable"]


@dataclass(frozen=True, slots=True)
class Engine:
    name: str
    uniform_tp: bool
    """One tensor-parallel width for every stage."""
    middle_equal: bool
    """Every stage but the first and last holds the same number of blocks."""
    shardings: tuple[str, ...]
    """The data-parallel shardings it runs (with more than one replica)."""
    schedules: tuple[str, ...]
    recomputes: tuple[str, ...]
    """The recomputation modes it runs (Plan.recompute)."""
    interleave_equal: bool
    """Interleaved chunks must all hold the same number of blocks."""
    source: str

    def restrict(self, *, sharding: Any, schedule: str, virtual_stages: Any,
                 recompute: Any) -> dict[str, Any]:
        """The search's space arguments cut to what this engine runs (refused when nothing
        is left)."""
        rcs = tuple(r for r in recompute if r in self.recomputes)
        if not rcs:
            msg = (f"engine {self.name}: runs recomputation {', '.join(self.recomputes)}, "
                   f"not {', '.join(recompute)}")
            raise SpecError(msg)
        shs = tuple(s for s in sharding if s in self.shardings)
        if not shs:
            msg = (f"engine {self.name}: runs sharding {', '.join(self.shardings)}, "
                   f"not {', '.join(sharding)}")
            raise SpecError(msg)
        if schedule not in self.schedules:
            msg = (f"engine {self.name}: runs the schedules {', '.join(self.schedules)}, "
                   f"not {schedule}")
            raise SpecError(msg)
        vs = tuple(virtual_stages)
        if self.interleave_equal:  # proven interleaving splits freely: leave it to the check
            vs = tuple(x for x in vs if x == 1) or (1,)
        return {"sharding": shs, "schedule": schedule, "virtual_stages": vs,
                "recompute": rcs, "middle_equal": self.middle_equal}


ENGINES: dict[str, Engine] = {
    "espresso": Engine("espresso", uniform_tp=False, middle_equal=False,
                       shardings=("none", "zero1", "zero2", "fsdp"),
                       schedules=("1f1b", "gpipe"), recomputes=("none", "full", "selective"),
                       interleave_equal=False, source="espresso.runner (docs/runner.md)"),
    "torchtitan": Engine("torchtitan", uniform_tp=True, middle_equal=False,
                         shardings=("zero2", "fsdp"), schedules=("1f1b", "gpipe"),
                         recomputes=("none", "full", "selective-op"), interleave_equal=False,
                         source="pytorch/torchtitan: torchtitan/config/job_config.py "
                                "(Parallelism), torchtitan/distributed/pipeline_parallel.py"),
    "megatron": Engine("megatron", uniform_tp=True, middle_equal=True,
                       shardings=("none", "zero1"), schedules=("1f1b",),
                       recomputes=("none", "full", "selective"), interleave_equal=True,
                       source="NVIDIA/Megatron-LM: megatron/training/arguments.py "
                              "(--decoder-first/last-pipeline-num-layers, "
                              "--use-distributed-optimizer)"),
}


@cache
def _profiles() -> dict[str, Any]:
    text = resources.files("espresso").joinpath("data/engine_profiles.yaml").read_text()
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def profile_constants(name: str) -> dict[str, Any]:
    """The cost-model constants of profile ``name`` (``torch-native``, ``megatron``)."""
    profiles = _profiles()["profiles"]
    if name not in profiles:
        msg = f"engine profile: expected one of {', '.join(profiles)}, got {name!r}"
        raise SpecError(msg)
    return dict(profiles[name]["cost_model"] or {})


def profile(engine: str) -> tuple[str, dict[str, Any]]:
    """(profile name, its cost-model constants) of an engine (``data/engine_profiles.yaml``):
    ``torch-native`` for espresso's runner and torchtitan, ``megatron`` for Megatron-LM."""
    engine_named(engine)
    name = _profiles()["engines"][engine]
    return name, profile_constants(name)


def engine_cost(engine: str, cost_model: CostParams | None) -> CostParams:
    """The cost model a search for ``engine`` uses: the one given (a measured one from
    ``calibrate --from-run``, or the user's), else the engine's profile."""
    if cost_model is not None:
        return cost_model
    return CostParams(**profile(engine)[1])


def engine_named(name: str) -> Engine:
    if name not in ENGINES:
        msg = f"engine: expected one of {', '.join(ENGINES)}, got {name!r}"
        raise SpecError(msg)
    return ENGINES[name]


def refusal(plan: Plan, engine: str | Engine) -> str | None:
    """Why ``engine`` cannot run ``plan`` (None: it can)."""
    eng = engine if isinstance(engine, Engine) else engine_named(engine)
    if plan.job.precision == "fp8" and eng.name == "espresso":
        # fp8 GEMMs need Transformer Engine (Megatron-LM) or torchao's Float8 (torchtitan).
        return "no fp8 GEMMs"
    P = plan.pp
    tps = sorted({st.tp for st in plan.stages})
    if eng.uniform_tp and len(tps) > 1:
        return f"stage TP widths differ ({'/'.join(str(st.tp) for st in plan.stages[:P])})"
    if plan.schedule not in eng.schedules:
        return f"no {plan.schedule} schedule"
    if plan.recompute not in eng.recomputes:
        return f"no {plan.recompute} recomputation"
    ddp_alone = eng.name == "torchtitan" and plan.sharding == "none" and P == 1 and tps == [1]
    if plan.dp > 1 and plan.sharding not in eng.shardings and not ddp_alone:
        return f"no {plan.sharding} sharding"
    counts = [st.num_layers for st in plan.stages]
    if plan.virtual_stages > 1:
        if eng.interleave_equal and len(set(counts)) > 1:
            return "interleaved chunks of unequal layer counts"
    elif eng.middle_equal and len(set(counts[1:-1])) > 1:
        return (f"middle stages of unequal layer counts "
                f"({'/'.join(str(n) for n in counts)})")
    return None


def runnable(plan: Plan) -> dict[str, str | None]:
    """Each engine's refusal of ``plan`` (None where it runs it)."""
    return {name: refusal(plan, eng) for name, eng in ENGINES.items()}
