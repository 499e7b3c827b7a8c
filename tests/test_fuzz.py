"""Property-based hardening: random and hostile catalogs, models, jobs, plans, files and
command lines through the public API and the CLI. Nothing may crash, hang or raise an
exception that is not the package's own (``EspressoError``); every plan returned is valid.

CI runs a bounded number of examples (profile ``ci``, the default); a longer run:

    pytest -m fuzz --hypothesis-profile long
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import espresso as es
from espresso.cli import main

pytestmark = pytest.mark.fuzz

LIMIT_S = 0.3
MARGIN_S = 10.0  # hang guard on a shared machine

BUILTIN = es.Catalog.builtin("gpus")

finite = st.floats(min_value=-1e6, max_value=1e12, allow_nan=False, allow_infinity=False)
hostile_number = st.one_of(
    finite, st.just(0), st.just(-1), st.just(float("nan")), st.just(float("inf")),
    st.just(1e308), st.just(1e-300), st.integers(-(2**70), 2**70), st.just("12"), st.none(),
    st.just(True))


def _gpu_dict(draw: Any, i: int, hostile: bool) -> dict[str, Any]:
    base = BUILTIN.gpus[draw(st.integers(0, len(BUILTIN) - 1))].to_dict()
    base.pop("spot_price_per_hour", None)
    base["name"] = f"G{i}"
    base["count"] = draw(st.sampled_from([0, 1, 2, 3, 4, 8, 16, 64]))
    base["gpus_per_node"] = draw(st.sampled_from([1, 2, 4, 8, 16]))
    base["memory_gb"] = draw(st.sampled_from([0.5, 4, 16, 24, 80, 192, 4096]))
    base["price_per_hour"] = draw(st.sampled_from([0.0, 1e-3, 0.5, 2.0, 40.0]))
    base["intra_node_gbs"] = draw(st.sampled_from([1e-3, 2.7, 32.0, 450.0]))
    base["inter_node_gbs"] = draw(st.sampled_from([1e-3, 1.25, 12.5, 50.0]))
    if hostile:
        field = draw(st.sampled_from(sorted(base)))
        base[field] = draw(hostile_number)
    return base


@st.composite
def catalogs(draw: Any, hostile: bool = False) -> dict[str, Any]:
    n = draw(st.integers(1, 4))
    bad = draw(st.integers(0, 3 * n)) if hostile else -1  # a quarter: one hostile field
    return {"gpus": [_gpu_dict(draw, i, i == bad) for i in range(n)]}


@st.composite
def models(draw: Any) -> dict[str, Any]:
    heads = draw(st.sampled_from([1, 2, 4, 8, 32]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8, 32) if heads % h == 0]))
    return {
        "name": "fuzz",
        "num_layers": draw(st.integers(1, 96)),
        "hidden_size": heads * draw(st.sampled_from([8, 64, 128])),
        "num_heads": heads,
        "num_kv_heads": kv,
        "ffn_hidden_size": draw(st.sampled_from([16, 1024, 11008, 1_000_000])),
        "vocab_size": draw(st.sampled_from([2, 1000, 32000, 10_000_000])),
        "gated_mlp": draw(st.booleans()),
        "tied_embeddings": draw(st.booleans()),
    }


@st.composite
def jobs(draw: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "model": draw(st.one_of(st.sampled_from(["llama2-7b", "gpt3-1.3b"]), models())),
        "seq_len": draw(st.sampled_from([1, 7, 128, 2048, 32768])),
        "global_batch_size": draw(st.sampled_from([1, 3, 16, 512, 4096])),
        "deadline_hours": draw(st.sampled_from([1e-3, 1.0, 24.0, 720.0, 1e9])),
    }
    if draw(st.booleans()):
        job["tokens"] = draw(st.sampled_from([1, 1e6, 2e10, 1e13]))
    else:
        job["iterations"] = draw(st.sampled_from([1, 100, 10**6]))
    return job


def _check_plan(plan: es.Plan, job: es.Job, catalog: es.Catalog, objective: str) -> None:
    est = plan.estimate
    assert est is not None and est.feasible
    assert est.meets_deadline or objective == "time"  # the time objective has no deadline
    assert math.isfinite(est.total_usd) and est.total_usd >= 0
    for gpu, n in plan.gpus.items():
        assert n <= catalog[gpu].count
    assert sum(s.num_layers for s in plan.stages) == job.model.num_layers


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(cat=catalogs(hostile=True), job=jobs(),
       objective=st.sampled_from(["cost", "time"]), max_stages=st.sampled_from([1, 4, 16]))
def test_plan_api_never_crashes(cat: dict[str, Any], job: dict[str, Any], objective: str,
                                max_stages: int) -> None:
    try:
        catalog = es.Catalog.from_dict(cat)
        j = es.Job.from_dict(job)
    except es.EspressoError:
        return  # refused with the package's own error: fine
    t = time.monotonic()
    try:
        plan = es.plan(j, catalog, time_limit_s=LIMIT_S, threads=1, objective=objective,
                       max_stages=max_stages)
    except es.EspressoError as exc:
        message = str(exc)
        assert message, "an error without a message"
    else:
        _check_plan(plan, j, catalog, objective)
    assert time.monotonic() - t < LIMIT_S + MARGIN_S


@given(cat=catalogs(), job=jobs(), data=st.data())
def test_estimate_any_hand_written_plan(cat: dict[str, Any], job: dict[str, Any],
                                        data: st.DataObject) -> None:
    catalog = es.Catalog.from_dict(cat)
    try:
        es.Job.from_dict(job)
    except es.EspressoError:
        return
    n = data.draw(st.integers(1, 5))
    stages = []
    begin = 0
    for _ in range(n):
        end = begin + data.draw(st.integers(-1, 40))
        stages.append({"gpu": data.draw(st.sampled_from([*catalog.names, "nope"])),
                       "tp": data.draw(st.sampled_from([1, 2, 3, 8, 64])),
                       "layers": [begin, end]})
        begin = end
    raw = {"job": job, "stages": stages, "dp": data.draw(st.sampled_from([1, 2, 7, 1 << 20])),
           "micro_batch_size": data.draw(st.sampled_from([1, 2, 3])),
           "schedule": data.draw(st.sampled_from(["1f1b", "gpipe", "zb"])),
           "recompute": data.draw(st.sampled_from(["none", "full", "some"]))}
    try:
        plan = es.Plan.from_dict(raw)
        est = es.estimate(plan, catalog)
    except es.EspressoError as exc:
        message = str(exc)
        assert message, "an error without a message"
        return
    assert est.feasible == (not est.reasons)
    again = es.estimate(es.Plan.from_json(plan.to_json()), catalog)
    assert again == est


file_text = st.one_of(
    st.binary(max_size=300).map(lambda b: b),
    st.text(max_size=300).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"", b"{", b"[" * 5000, b"gpus: 1e-3", b"hosts: []", b"\xff\xfe",
                     b"gpus:\n  - {name: X}\n", b'{"schema": "espresso.plan/1"}',
                     b"model: llama2-7b\ndeadline: 7d\ntokens: 1e9\n", b"*a",
                     b"!!python/object:os.system ls"]),
)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(content=file_text,
       command=st.sampled_from(["catalog", "estimate", "job", "hosts", "cost-model", "model"]))
def test_cli_any_file(content: bytes, command: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "in.yaml")
        with open(path, "wb") as fh:
            fh.write(content)
        example = os.path.join(os.path.dirname(__file__), "..", "examples", "plans",
                               "llama2-7b-a100-l40s.json")
        argv = {
            "catalog": ["gpus", "--catalog", path],
            "estimate": ["estimate", path],
            "job": ["plan", "--job", path, "--time-limit", str(LIMIT_S), "--no-compare"],
            "hosts": ["launch", example, "--hosts", path],
            "cost-model": ["estimate", example, "--cost-model", path],
            "model": ["plan", "--model", path, "--tokens", "1e9", "--deadline", "1d",
                      "--time-limit", str(LIMIT_S), "--no-compare"],
        }[command]
        code = main(argv)
        assert code in (0, 1, 2)


flag_value = st.one_of(
    st.sampled_from(["0", "-1", "nan", "inf", "-inf", "1e400", "1e-400", "", " ", "7d",
                     "3.5", "2e10", "20B", "abc", "1" * 40, "0x10"]),
    st.integers(-(2**40), 2**40).map(str))


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(flag=st.sampled_from(["--tokens", "--iterations", "--deadline", "--seq-len",
                             "--global-batch", "--threads", "--time-limit", "--budget",
                             "--top-k", "--max-stages", "--max-tp"]), value=flag_value)
def test_cli_plan_flags(flag: str, value: str) -> None:
    argv = ["plan", "--model", "gpt3-1.3b", "--tokens", "1e9", "--deadline", "7d",
            "--no-compare", "--time-limit", str(LIMIT_S), flag, value]
    t = time.monotonic()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses a malformed value
        code = exc.code  # type: ignore[assignment]
    assert code in (0, 1, 2)
    limit = LIMIT_S
    if flag == "--time-limit":
        with contextlib.suppress(ValueError):
            limit = max(LIMIT_S, float(value)) if math.isfinite(float(value)) else LIMIT_S
    assert time.monotonic() - t < min(limit, 60.0) + MARGIN_S


# A plan of the cloud snapshot with spot rows: every part of the estimate is present (rent,
# stages, spot), for the fuzzer to break.
_SPOT_PLAN: dict[str, Any] | None = None


def _spot_plan() -> dict[str, Any]:
    global _SPOT_PLAN
    if _SPOT_PLAN is None:
        from espresso.cloud.spot import with_spot

        job = es.Job.from_dict({"model": "gpt3-1.3b", "tokens": 1e9, "deadline_hours": 48})
        cat = with_spot(es.Catalog.builtin(), only=True)
        _SPOT_PLAN = es.plan(job, cat, time_limit_s=10).to_dict()
    return _SPOT_PLAN


hostile_value = st.one_of(
    hostile_number, st.text(max_size=5), st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.just([{"x": 1}]), st.just({"offer": 5}), st.just(["x"]), st.just(5.0))


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=100)
@given(data=st.data(), value=hostile_value)
def test_plan_estimate_fields(data: st.DataObject, value: Any) -> None:
    """Any value in any field of a plan's estimate (its top level, a stage, a rent entry,
    the spot figures, or the field missing) is read or refused with PlanError; what is read
    prints, exports and round-trips without another exception (issue 25)."""
    import copy
    import io

    from rich.console import Console

    from espresso.cli.report import print_estimate, rent_lines

    raw = copy.deepcopy(_spot_plan())
    est = raw["estimate"]
    where = data.draw(st.sampled_from(["top", "stage", "rent", "spot"]))
    target = {"top": est, "stage": est["stages"][0], "rent": est["rent"][0],
              "spot": est["spot"]}[where]
    key = data.draw(st.sampled_from(sorted(target)))
    if data.draw(st.booleans()):
        target[key] = value
    else:
        del target[key]
    try:
        plan = es.Plan.from_dict(raw)
    except es.PlanError as exc:
        message = str(exc)
        assert message, "an error without a message"
        return
    assert plan.estimate is not None
    print_estimate(plan, plan.estimate, Console(file=io.StringIO(), width=200))
    rent_lines(plan.estimate)
    again = es.Plan.from_json(plan.to_json())
    assert again.estimate == plan.estimate
    from espresso.cloud.skypilot_export import node_groups

    with contextlib.suppress(es.PlanError):
        node_groups(plan)
