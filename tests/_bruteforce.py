"""A plain brute-force planner written only on top of espresso.estimate() and the plan
contract: every data-parallel degree, micro-batch size, recomputation, sharding of the model
states over the replicas, multiset of stage
groups (GPU type, power-of-two TP width), stage order and contiguous layer split; a plan
uses one vendor's GPUs in one location (provider and region), and 1F1B plans with more than
one micro-batch have at most one stage per micro-batch, as the search's rules say."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator

import pytest

import espresso as es
from espresso.gpu_type import runs_precision


def widths(model: es.ModelSpec, gpu: es.GpuType, max_tp: int) -> list[int]:
    out, w = [], 1
    while w <= min(gpu.gpus_per_node, max_tp):
        kv = model.kv_heads
        if (model.num_heads % w == 0 and (kv % w == 0 or w % kv == 0)
                and model.ffn % w == 0):
            out.append(w)
        w *= 2
    return out


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(parts))


def multisets(groups: list[tuple[str, int]], max_len: int) -> Iterator[tuple[tuple[str, int], ...]]:
    for n in range(1, max_len + 1):
        yield from itertools.combinations_with_replacement(groups, n)


def brute_force(job: es.Job, catalog: es.Catalog, *, micro_batch_sizes: tuple[int, ...] = (1, 2),
                recompute: tuple[str, ...] = ("none", "full"),
                sharding: tuple[str, ...] = ("none", "zero1", "zero2", "fsdp"),
                max_stages: int | tuple[int, ...] = 4,
                max_tp: int = 8, cost_model: es.CostParams | None = None,
                profiles: dict[str, es.Profile] | None = None, objective: str = "cost",
                budget_usd: float = math.inf, sequence_parallel: bool | None = None,
                virtual_stages: tuple[int, ...] = (1,), even_split: bool = False,
                tp_widths: tuple[int, ...] | None = None,
                accept: Callable[[es.Plan], bool] | None = None,
                ) -> tuple[float, es.Plan | None, int]:
    """(best objective, best plan, plans estimated); inf when nothing is feasible. ``cost``:
    least USD meeting the deadline; ``time``: least hours within ``budget_usd`` (deadline
    ignored). ``max_stages``: one depth, or one per number of GPU types (the last for more).
    ``sequence_parallel``: as the search's default when None (on when every
    power-of-two TP width up to ``max_tp`` divides the sequence length). ``virtual_stages``:
    stages per GPU group (v >= 2: interleaved 1F1B, each group's blocks in v near-equal
    chunks, the larger first, when there are at least 2 groups, M is a multiple of their
    number and each holds v blocks). ``accept``: only plans it accepts (an engine's rules)."""
    tiers = max_stages if isinstance(max_stages, tuple) else (max_stages,)
    deepest = tiers[0]

    def depth_ok(ms: tuple[tuple[str, int], ...]) -> bool:
        # Depth by variety: entry i for plans of i + 1 GPU types (catalog rows), the last
        # for more.
        types = len({name for name, _ in ms})
        return len(ms) <= tiers[min(types, len(tiers)) - 1]

    if sequence_parallel is None:
        sequence_parallel = job.seq_len % (1 << (max_tp.bit_length() - 1)) == 0
    model = job.model
    # Only the GPUs the job's precision runs on (bf16 and fp8 need bf16 tensor cores).
    groups = [(g.name, w) for g in catalog for w in widths(model, g, max_tp)
              if (tp_widths is None or w in tp_widths) and runs_precision(g, job.precision)]

    def splits(parts: int) -> Iterator[tuple[int, ...]]:
        # every contiguous split, or only the even one (the first L % P stages one more)
        if not even_split:
            yield from compositions(model.num_layers, parts)
            return
        L = model.num_layers
        if parts <= L:
            yield tuple(L // parts + (1 if i < L % parts else 0) for i in range(parts))
    best, best_plan, count = math.inf, None, 0
    B = job.global_batch_size
    for rc, sh in itertools.product(recompute, sharding):
        for b in micro_batch_sizes:
            if B % b:
                continue
            for dp in range(1, B // b + 1):
                if (B // b) % dp or (dp == 1 and sh != sharding[0]):
                    continue  # one replica: every sharding is the same plan
                m = B // b // dp
                # 1F1B with 1 < M < stages runs as GPipe; the search keeps to stages <= M.
                most = min(deepest, model.num_layers, m if m > 1 else deepest)
                for ms in multisets(groups, most):
                    if not depth_ok(ms):
                        continue
                    if len({(catalog[n].vendor, catalog[n].location) for n, _ in ms}) > 1:
                        continue
                    use: dict[str, int] = {}
                    for name, w in ms:
                        use[name] = use.get(name, 0) + w * dp
                    if any(use[n] > catalog[n].count for n in use):
                        continue
                    # Shared limits: the instances of a pool's rows together.
                    pools: dict[str, float] = {}
                    for n, used in use.items():
                        g = catalog[n]
                        if g.pool is not None:
                            inst = -(-used // g.gpus_per_node)
                            pools[g.pool] = pools.get(g.pool, 0.0) + inst * (g.pool_units or 0)
                    if any(u > (catalog.gpus[[g.pool for g in catalog].index(p)].pool_limit
                                or 0) * (1 + 1e-9) for p, u in pools.items()):
                        continue
                    for order, split, v in itertools.product(
                            set(itertools.permutations(ms)),
                            splits(len(ms)), virtual_stages):
                        P = len(order)
                        if v > 1 and (P < 2 or m % P or min(split) < v):
                            continue
                        # Stage c * P + i: chunk c of group i, chunks as equal as possible.
                        stages, begin = [], 0
                        for c in range(v):
                            for (name, w), n in zip(order, split, strict=True):
                                k = n // v + (1 if c < n % v else 0)
                                stages.append(es.Stage(gpu=name, tp=w, layers=(begin, begin + k)))
                                begin += k
                        plan = es.Plan(job=job, stages=tuple(stages), dp=dp,
                                       micro_batch_size=b, num_microbatches=m,
                                       recompute=rc, sharding=sh, virtual_stages=v,
                                       sequence_parallel=sequence_parallel,
                                       cost_model=cost_model or es.CostParams(),
                                       profiles={g: p for g, p in (profiles or {}).items()
                                                 if any(st.gpu == g for st in stages)})
                        if accept is not None and not accept(plan):
                            continue
                        est = es.estimate(plan, catalog)
                        count += 1
                        if not est.feasible:
                            continue
                        if objective == "cost":
                            if est.meets_deadline and est.total_usd < best:
                                best, best_plan = est.total_usd, plan
                        elif est.total_usd <= budget_usd and est.total_hours < best:
                            best, best_plan = est.total_hours, plan
    return best, best_plan, count


def assert_same_optimum(result: es.SearchResult, expected: float, plan: object) -> None:
    """The search ran to the end and found the brute force's optimum (``expected``, its total
    cost; infinite: neither has a plan). ``plan``: the brute force's, shown on failure."""
    assert result.stats.complete
    got = result.plans[0].estimate.total_usd if result.plans else math.inf  # type: ignore[union-attr]
    if math.isinf(expected):
        assert math.isinf(got)
    else:
        assert got == pytest.approx(expected, rel=1e-9), plan
