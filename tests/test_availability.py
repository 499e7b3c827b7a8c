"""Which availability rule set each rented offer's instances, said once and never
contradicted (issue 30, item 4, first part)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import espresso as es
from espresso.cli import main
from espresso.cloud.quota import apply_quota, max_instances
from espresso.gpu_type import ASSUMED

JOB = es.Job(model=es.ModelSpec.preset("llama2-7b"), tokens=2e10, deadline_hours=24 * 7)


def offers(*items: tuple[str, str, int, float, int]) -> es.Catalog:
    return es.Catalog.from_dict({"offers": [
        {"provider": "aws", "region": region, "instance_type": it, "gpu": "H100-SXM",
         "gpus_per_instance": n, "price_per_hour": price, "instances": inst}
        for region, it, n, price, inst in items]})


def test_the_snapshot_states_its_assumption_per_offer_and_the_plan_carries_it() -> None:
    cat = es.Catalog.builtin()
    # Every offer says its rule: the assumption, or a marketplace's listed hosts.
    assert all(g.availability == ASSUMED for g in cat if g.provider != "vast")
    assert all(str(g.availability).startswith("marketplace: ") for g in cat
               if g.provider == "vast")
    rules = set()
    for job in (JOB, replace(JOB, deadline_hours=72)):  # a Vast host; an assumed offer
        plan = es.plan(job, cat)
        assert plan.estimate is not None
        rent = plan.estimate.rent[0]
        assert rent["availability"] == cat[rent["offer"]].availability
        assert rent["available"] == cat[rent["offer"]].instances >= rent["instances"]
        again = es.Plan.from_dict(json.loads(plan.to_json()))
        assert again.estimate is not None
        assert again.estimate.rent[0]["availability"] == rent["availability"]
        rules.add(rent["availability"].split(" ")[0])
    assert rules == {"marketplace:", ASSUMED.split(" ")[0]}
    # A catalog the user writes gives its own counts: no rule to state.
    own = offers(("us-east-1", "p5.48xlarge", 8, 55.04, 3))
    assert own.gpus[0].availability is None
    p = es.plan(JOB, own)
    assert p.estimate is not None and p.estimate.rent[0]["available"] == 3
    assert "availability" not in p.estimate.rent[0]


def test_a_quota_entry_names_itself_and_unmatched_offers_keep_theirs() -> None:
    cat = es.Catalog.builtin()
    some = apply_quota(cat, {"quotas": [{"provider": "aws", "instance_type": "p5.48xlarge",
                                         "instances": 2}]})
    p5 = [g for g in some if g.instance_type == "p5.48xlarge" and g.provider == "aws"]
    assert p5 and all(g.instances == 2 and g.availability ==
                      "quota file entry 1 (provider aws, instance_type p5.48xlarge: "
                      "2 instances each)" for g in p5)
    others = [g for g in some if g.instance_type != "p5.48xlarge"]
    assert others and all(g.availability == ASSUMED for g in others if g.provider != "vast")
    assert all(str(g.availability).startswith("marketplace") for g in others
               if g.provider == "vast")
    # Some offers are still assumed: the note stays, and says the rest keep theirs.
    assert any(n.startswith("availability is an assumption") for n in some.notes)
    assert any("offers no entry matches keep their own" in n for n in some.notes)
    every = apply_quota(cat, {"quotas": [], "default": 1})
    assert all(g.availability == "quota file default (1 instances)" for g in every)
    assert not any(n.startswith("availability is an assumption") for n in every.notes)


def test_max_instances_replaces_the_assumption_it_lowers() -> None:
    cat = offers(("r1", "big", 8, 50.0, 4), ("r1", "huge", 16, 100.0, 2))
    cat = es.Catalog(gpus=tuple(g.__class__(**{**g.to_dict(), "availability": ASSUMED})
                                for g in cat), notes=("availability is an assumption: x",))
    capped = max_instances(cat, 2)
    big, huge = capped.gpus
    assert (big.instances, big.availability) == (2, "--max-instances 2")
    assert (huge.instances, huge.availability) == (2, ASSUMED)  # not lowered: still assumed
    assert not any(n.startswith("availability is an assumption") for n in capped.notes)
    assert capped.notes[-1] == ("availability: at most 2 instances of each offer "
                                "(--max-instances); 1 offers keep the fewer instances assumed "
                                "without a quota (32 GPUs per offer)")
    lower = max_instances(cat, 1)
    assert all(g.availability == "--max-instances 1" for g in lower)
    assert lower.notes[-1] == "availability: at most 1 instances of each offer (--max-instances)"


def test_cli_prints_the_rule_and_no_contradiction(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", "--model", "llama2-7b", "--tokens", "2e10", "--deadline", "3d",
               "--max-instances", "1"])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 0
    assert "(--max-instances 1)" in out and "Availability: 1 of 1 x" in out
    assert "availability is an assumption" not in out
    quota = tmp_path / "q.yaml"
    quota.write_text("quotas:\n  - {provider: lambda, instances: 3}\ndefault: 0\n")
    rc = main(["plan", "--model", "llama2-7b", "--tokens", "2e10", "--deadline", "7d",
               "--quota", str(quota)])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 0 and "of 3 x gpu_" in out
    assert "(quota file entry 1 (provider lambda: 3 instances each))" in out
    assert "availability is an assumption" not in out


def test_a_bad_availability_in_a_plan_file_is_refused() -> None:
    data = json.loads(es.plan(JOB, es.Catalog.builtin()).to_json())
    data["estimate"]["rent"][0]["available"] = "four"
    with pytest.raises(es.PlanError, match=r"rent\[0\]\.available"):
        es.Plan.from_dict(data)
