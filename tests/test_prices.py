"""Price sanity (issue 30, item 5): a plan that rents an offer priced far below its GPU's
other offers says so, in the output and the plan JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import espresso as es
from espresso.cli import main
from espresso.cloud.prices import MIN_PEERS, PEER_FRACTION, SPOT_FLOOR, price_notes
from espresso.cloud.spot import with_spot


def offer(region: str, price_per_gpu: float, *, gpu: str = "L4", n: int = 8,
          spot: float | None = None, provider: str = "aws") -> dict[str, object]:
    out: dict[str, object] = {"provider": provider, "region": region,
                              "instance_type": "g6.48xlarge",
                              "gpu": gpu, "gpus_per_instance": n,
                              "price_per_hour": price_per_gpu * n, "instances": 4}
    if spot is not None:
        out["spot_price_per_hour"] = spot * n
    return out


def catalog(*offers: dict[str, object]) -> es.Catalog:
    return es.Catalog.from_dict({"offers": list(offers)})


def test_an_offer_under_a_third_of_its_peers_median_is_flagged() -> None:
    peers = [offer(f"r{i}", p) for i, p in enumerate((1.0, 1.2, 1.4))]
    cat = catalog(*peers, offer("cheap", 0.3), offer("odd", 0.45))
    notes = price_notes(cat)
    # Both have the median 1.10 of the four others; a third of it is 0.367.
    assert 0.3 < PEER_FRACTION * 1.1 < 0.45
    assert set(notes) == {"aws/cheap/g6.48xlarge"}
    note = notes["aws/cheap/g6.48xlarge"]
    assert "$0.30/GPU-h is 0.27x the median ($1.10) of 4 other L4 on-demand offers" in note


def test_one_provider_in_many_regions_does_not_outvote_the_others() -> None:
    """The typical price is the lower median of the providers' medians: a GPU cloud selling at
    a fifth of a hyperscaler's price in thirty regions is not an outlier for that."""
    aws = [offer(f"r{i}", 3.0) for i in range(30)]
    cat = catalog(*aws, offer("a", 0.6, provider="lambda"), offer("b", 0.5, provider="cudo"),
                  offer("c", 0.1, provider="vast"))
    notes = price_notes(cat)
    # cudo: others' medians 3.0 (aws), 0.6 (lambda), 0.1 (vast) -> 0.6; 0.5 is 0.83x.
    # vast: 3.0, 0.6, 0.5 -> 0.6; 0.1 is 0.17x. Against the plain median of the 32 other
    # offers (3.0) the cudo and lambda rows would be flagged too.
    assert set(notes) == {"vast/c/g6.48xlarge"}
    assert ("0.17x the typical price ($0.60: the median of 3 providers' medians) of 32 other "
            "L4 on-demand offers") in notes["vast/c/g6.48xlarge"]


def test_too_few_peers_say_nothing() -> None:
    cat = catalog(*[offer(f"r{i}", 1.0) for i in range(MIN_PEERS - 1)], offer("cheap", 0.01))
    assert price_notes(cat) == {}
    # Another GPU's prices are not peers.
    cat = catalog(*[offer(f"r{i}", 1.0, gpu="L40S") for i in range(5)], offer("c", 0.01))
    assert price_notes(cat) == {}


def test_spot_rows_against_spot_peers_and_their_own_on_demand_price() -> None:
    base = [offer(f"r{i}", 1.0, spot=0.4) for i in range(4)]
    cat = with_spot(catalog(*base, offer("deep", 1.0, spot=0.1), offer("fair", 1.0, spot=0.2)))
    notes = price_notes(cat)
    # 0.10 of on demand is under the floor (and under a third of the spot median, 0.4);
    # 0.20 is neither; no on-demand row is flagged by the spot rows' prices.
    assert set(notes) == {"aws/deep/g6.48xlarge:spot"}
    assert SPOT_FLOOR * 1.0 > 0.1 and "0.10x its on-demand price ($1.00" in notes[
        "aws/deep/g6.48xlarge:spot"]
    # A spot row cheap against the on-demand rows is not an outlier among spot rows.
    cat = with_spot(catalog(*[offer(f"r{i}", 1.0, spot=0.3) for i in range(4)]))
    assert price_notes(cat) == {}


def test_the_plan_says_so_in_its_rent_list_and_json(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    cat = catalog(*[offer(f"r{i}", 1.7) for i in range(4)], offer("cheap", 0.5))
    path = tmp_path / "cat.yaml"
    cat.save(path)
    job = es.Job(model=es.ModelSpec.preset("gpt3-1.3b"), tokens=2e9, deadline_hours=240)
    plan = es.plan(job, cat, threads=1)
    assert plan.estimate is not None
    rent = plan.estimate.rent
    assert [r["offer"] for r in rent] == ["aws/cheap/g6.48xlarge"]
    assert "0.29x the median ($1.70) of 4 other L4" in rent[0]["price_note"]
    out = tmp_path / "plan.json"
    rc = main(["plan", "--model", "gpt3-1.3b", "--tokens", "2e9", "--deadline", "10d",
               "--catalog", str(path), "--json", str(out), "--threads", "1"])
    text = " ".join(capsys.readouterr().out.split())
    assert rc == 0 and "Price: g6.48xlarge in aws cheap at $0.50/GPU-h is 0.29x" in text
    data = json.loads(out.read_text())
    assert data["estimate"]["rent"][0]["price_note"] == rent[0]["price_note"]
    again = es.Plan.from_json(out)
    assert again.estimate is not None and again.estimate.rent[0]["price_note"]
    # A plan on fair prices carries no note.
    fair = es.plan(job, catalog(*[offer(f"r{i}", 1.7) for i in range(4)]), threads=1)
    assert fair.estimate is not None and "price_note" not in fair.estimate.rent[0]


def test_a_bad_price_note_in_a_plan_file_is_refused(tmp_path: Path) -> None:
    cat = catalog(*[offer(f"r{i}", 1.7) for i in range(4)], offer("cheap", 0.5))
    job = es.Job(model=es.ModelSpec.preset("gpt3-1.3b"), tokens=2e9, deadline_hours=240)
    data = json.loads(es.plan(job, cat, threads=1).to_json())
    data["estimate"]["rent"][0]["price_note"] = 3
    with pytest.raises(es.PlanError, match=r"rent\[0\]\.price_note"):
        es.Plan.from_dict(data)
