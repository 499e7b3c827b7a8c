"""Networks between instances: published figures, stated defaults for instance types the
table does not know, and the user's --network-gbs (issue 30, item 3)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import espresso as es
from espresso.cli import main
from espresso.cloud.networks import default_network, network_for, not_in_table

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "catalogs" / "seeweb_gpu_vms.csv"


def offer(provider: str, instance_type: str, gpus: int, **extra: object) -> dict[str, object]:
    return {"provider": provider, "region": "r1", "instance_type": instance_type, "gpu": "L4",
            "gpus_per_instance": gpus, "price_per_hour": 1.0 * gpus, "instances": 4, **extra}


@pytest.mark.parametrize(("provider", "gpus", "gbps", "cls"), [
    ("aws", 8, 100, "hyperscaler"), ("gcp", 16, 100, "hyperscaler"),
    ("azure", 4, 20, "hyperscaler"), ("oci", 1, 20, "hyperscaler"),
    ("vast", 8, 1, "marketplace"), ("vast", 1, 1, "marketplace"),
    ("seeweb", 1, 10, "gpu-cloud"), ("nebius", 8, 10, "gpu-cloud"),
])
def test_default_by_provider_class_and_gpus(provider: str, gpus: int, gbps: float,
                                            cls: str) -> None:
    net = default_network(provider, gpus)
    assert net.assumption and net.gbps == gbps and cls in net.label
    assert not_in_table(net.label)
    row = es.Catalog.from_dict({"offers": [offer(provider, "new-type-x", gpus)]}).gpus[0]
    assert row.inter_node_gbs == pytest.approx(gbps / 8 / gpus)  # per GPU, GB/s
    assert row.network_assumed and row.network_source == net.label


def test_published_figures_are_kept_and_marked_only_when_assumed() -> None:
    cat = es.Catalog.from_dict({"offers": [offer("aws", "g6.48xlarge", 8),
                                           offer("lambda", "gpu_8x_a100", 8)]})
    g6, lam = cat.gpus
    assert g6.inter_node_gbs == pytest.approx(100 / 8 / 8) and not g6.network_assumed
    assert lam.network_assumed and not not_in_table(lam.network_source or "")
    assert not any("network assumed" in n for n in cat.notes)  # a table entry: documented
    assert network_for("ECS1GPU10") is None


def test_network_gbs_replaces_the_default_only() -> None:
    cat = es.Catalog.from_dict({"offers": [offer("aws", "g6.48xlarge", 8),
                                           offer("aws", "p9.mystery", 8),
                                           offer("vast", "8x RTX", 2, region="r2")]},
                               network_gbs=3.5)
    known, p9, vast = cat.gpus
    assert known.inter_node_gbs == pytest.approx(100 / 8 / 8)  # published: kept
    assert p9.inter_node_gbs == 3.5 and vast.inter_node_gbs == 3.5
    assert p9.network_assumed and "3.5 GB/s per GPU given with --network-gbs" in str(
        p9.network_source)
    # One note for the given figure, whatever the instances' GPU counts.
    notes = [n for n in cat.notes if "network assumed" in n]
    assert len(notes) == 1 and "2 instance types" in notes[0] and "p9.mystery" in notes[0]
    # An offer's own figure wins over both.
    own = es.Catalog.from_dict({"offers": [offer("x", "t", 2, network_gbs=0.5)]},
                               network_gbs=3.5).gpus[0]
    assert own.inter_node_gbs == 0.5 and not own.network_assumed


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, "fast"])
def test_bad_network_gbs_is_refused_with_its_name(bad: object) -> None:
    with pytest.raises(es.CatalogError, match="network_gbs"):
        es.Catalog.from_dict({"offers": [offer("x", "t", 1)]}, network_gbs=bad)  # type: ignore[arg-type]


def test_an_unknown_provider_csv_plans_and_states_its_assumption(tmp_path: Path) -> None:
    cat = es.Catalog.open(f"skypilot:{EXAMPLE}")
    assert len(cat) == 20 and all(g.network_assumed for g in cat)  # 21 rows, RTX6000 skipped
    assert any("network assumed for 20 instance types" in n for n in cat.notes)
    job = es.Job(model=es.ModelSpec.preset("llama2-13b"), tokens=2e10, deadline_hours=240)
    # Within one instance the network between instances carries nothing: nothing to state
    # (on the slow default the cheapest plan is one 8-GPU instance).
    one = es.plan(job, cat, threads=1, time_limit_s=60)
    assert one.estimate is not None and [r["instances"] for r in one.estimate.rent] == [1]
    assert "network_assumption" not in one.estimate.rent[0]
    # A faster figure given for these instance types makes two instances pay off.
    fast = es.Catalog.open(f"skypilot:{EXAMPLE}", network_gbs=2.5)
    plan = es.plan(job, fast, threads=1, time_limit_s=60)
    assert plan.stats and plan.stats["complete"]
    rent = plan.estimate.rent if plan.estimate else ()
    assert sum(r["instances"] for r in rent) > 1
    assert all("2.5 GB/s per GPU given with --network-gbs" in r["network_assumption"]
               for r in rent)
    assert plan.estimate is not None and one.estimate.total_usd > plan.estimate.total_usd
    # The plan JSON keeps the assumption and reads back.
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    again = es.Plan.from_json(path)
    assert again.estimate is not None
    assert again.estimate.rent[0]["network_assumption"] == rent[0]["network_assumption"]


def test_cli_prints_the_assumption_under_the_plan(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "p.json"
    rc = main(["plan", "--model", "llama2-13b", "--tokens", "2e10", "--deadline", "10d",
               "--catalog", f"skypilot:{EXAMPLE}", "--network-gbs", "2.5",
               "--json", str(out_json), "--threads", "1"])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 0
    assert "Network of ECS" in out and "2.5 GB/s per GPU given with --network-gbs" in out
    data = json.loads(out_json.read_text())
    assert "--network-gbs" in data["estimate"]["rent"][0]["network_assumption"]
    rc = main(["plan", "--model", "llama2-7b", "--tokens", "2e10", "--deadline", "10d",
               "--catalog", f"skypilot:{EXAMPLE}", "--network-gbs", "-1"])
    err = capsys.readouterr()
    assert rc == 2 and "network_gbs (--network-gbs)" in err.out + err.err
