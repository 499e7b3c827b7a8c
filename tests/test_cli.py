from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import espresso as es
from espresso.cli import main
from espresso.units import format_seconds

EXAMPLE = Path(__file__).parents[1] / "examples" / "plans" / "llama2-7b-a100-l40s.json"


def test_gpus_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus"]) == 0
    out = capsys.readouterr().out
    for name in ("H200", "B200", "A100-40GB", "L4", "aws, gcp, lambda"):
        assert name in out
    assert main(["gpus", "--catalog", "builtin:gpus"]) == 0
    out = capsys.readouterr().out
    for name in ("H200", "MI300X", "RTX-4090", "T4"):
        assert name in out
    assert "7.912" in out  # the H200's price


def test_gpus_json_and_custom_catalog(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert es.Catalog.from_dict(data) == es.Catalog.builtin()
    small = tmp_path / "small.yaml"
    es.Catalog(gpus=(es.Catalog.builtin("gpus")["L4"],)).save(small)
    assert main(["gpus", "--catalog", str(small)]) == 0
    out = capsys.readouterr().out
    assert "L4" in out and "H200" not in out


def test_models_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "llama2-70b" in out and "68.977 B" in out
    assert main(["models", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["llama2-7b"]["num_params"] == 6_738_415_616


def test_estimate_prints_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    est = es.estimate(es.Plan.from_json(EXAMPLE))
    assert f"${est.total_usd:,.2f}" in out
    assert f"Iteration {format_seconds(est.iteration_s)} = pipeline" in out
    assert f"{est.stages[1].memory_gb:.1f} GB" in out
    assert "Feasible: yes" in out


def test_estimate_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    assert main(["estimate", str(EXAMPLE), "--json", str(out)]) == 0
    plan = es.Plan.from_json(out)
    assert plan.estimate == es.estimate(es.Plan.from_json(EXAMPLE))
    capsys.readouterr()
    assert main(["estimate", str(EXAMPLE), "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["estimate"]["feasible"] is True


def test_estimate_infeasible_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = json.loads(EXAMPLE.read_text())
    d["stages"][1]["gpu"] = "L4"
    d["stages"][1]["layers"] = [20, 30]
    del d["gpus"]
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    assert main(["estimate", str(p)]) == 1
    out = capsys.readouterr().out
    assert "Feasible: no" in out
    assert "layers [30, 32) are held by no stage" in out
    assert "GB over" in out


def test_bad_input_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    d = json.loads(EXAMPLE.read_text())
    d["stages"][0]["gpu"] = "A100"
    p = tmp_path / "p.json"
    del d["gpus"]
    p.write_text(json.dumps(d))
    assert main(["estimate", str(p)]) == 2
    assert "unknown GPU type 'A100'" in capsys.readouterr().err
    cat = tmp_path / "c.yaml"
    cat.write_text("gpus:\n  - name: X\n")
    assert main(["gpus", "--catalog", str(cat)]) == 2
    assert "missing required field" in capsys.readouterr().err


def test_console_script_runs() -> None:
    r = subprocess.run([sys.executable, "-m", "espresso.cli", "--version"], capture_output=True,
                       text=True, check=False)
    assert r.returncode == 0 and "espresso" in r.stdout


PLAN_7B = ["plan", "--model", "llama2-7b", "--tokens", "2e10", "--deadline", "7d"]


def test_plan_json_is_deterministic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The plan file holds the plan and its estimate only: byte for byte the same on every
    run and thread count; --stats adds the search statistics."""
    outs = []
    for i, threads in enumerate(("1", "2", "2")):
        out = tmp_path / f"p{i}.json"
        assert main([*PLAN_7B, "--threads", threads, "--json", str(out)]) == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] == outs[2]
    assert "stats" not in json.loads(outs[0])
    with_stats = tmp_path / "s.json"
    assert main([*PLAN_7B, "--json", str(with_stats), "--stats"]) == 0
    data = json.loads(with_stats.read_text())
    assert data["stats"]["gap"] == 0.0 and data["stats"]["nodes_expanded"] > 0
    plain = es.Plan.from_json(tmp_path / "p0.json")
    assert es.Plan.from_json(with_stats).estimate == plain.estimate
    capsys.readouterr()


def test_estimate_missed_deadline_is_infeasible(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    d = json.loads(EXAMPLE.read_text())
    d["job"]["deadline_hours"] = 1.0
    p = tmp_path / "late.json"
    p.write_text(json.dumps(d))
    assert main(["estimate", str(p)]) == 1
    out = capsys.readouterr().out
    assert "Feasible: no" in out and "meets the deadline: no" in out
    assert "Feasible: yes" not in out
    assert "does not meet the deadline" in out


def test_budget_plan_compares_on_time(capsys: pytest.CaptureFixture[str]) -> None:
    # The GPU-type catalog: the fastest plan within a budget takes ~12 s to prove on the
    # cloud snapshot (its Lambda regions), more than this wording test should wait.
    assert main([*PLAN_7B, "--budget", "3000", "--time-limit", "20",
                 "--catalog", "builtin:gpus"]) == 0
    out = capsys.readouterr().out
    assert "saves -" not in out
    assert "faster" in out or "already uses one type" in out or "slower" in out


def test_top_k_prints_k_plans(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*PLAN_7B, "--top-k", "3"]) == 0
    out = capsys.readouterr().out
    assert "The 3 best plans" in out
    rows = [line for line in out.splitlines() if line.startswith("│ ") and "$" in line
            and "x" in line and line.split("│")[1].strip() in {"1", "2", "3"}]
    assert len(rows) == 3
    assert main([*PLAN_7B, "--top-k", "0"]) == 2
    assert "top_k" in capsys.readouterr().err


def test_huge_deadline_reads_well(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "llama2-7b", "--tokens", "2e10", "--deadline", "1e30"]) == 0
    out = capsys.readouterr().out
    assert "years" in out
    assert not any(len(tok.replace(",", "")) > 20 and tok.replace(",", "").isdigit()
                   for tok in out.replace("(", " ").replace(")", " ").split())


def test_time_limit_is_the_commands_wall_clock(capsys: pytest.CaptureFixture[str]) -> None:
    import time

    assert "default 60 s" in " ".join(
        __import__("espresso.cli", fromlist=["build_parser"]).build_parser()
        ._subparsers._group_actions[0].choices["plan"].format_help().split())
    t = time.monotonic()
    code = main(["plan", "--model", "llama2-7b", "--tokens", "2e11", "--deadline", "2d",
                 "--time-limit", "6", "--threads", "2", "--catalog", "builtin:gpus"])
    assert time.monotonic() - t < 6 + 10  # hang guard, generous on a noisy machine
    out = capsys.readouterr().out
    assert code == 1
    assert "no plan meets the deadline of 48.0 h" in out
    assert "fastest plan" in out


def test_sharding_and_recompute_choices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--sharding and --recompute restrict what the search tries; a bad word is refused with
    the list of allowed ones."""
    out = tmp_path / "p.json"
    assert main([*PLAN_7B, "--sharding", "none", "--recompute", "full", "--json", str(out)]) == 0
    plan = es.Plan.from_json(out)
    assert plan.sharding == "none" and plan.recompute == "full"
    assert "sharding" not in json.loads(out.read_text())  # the default is not written
    assert main([*PLAN_7B, "--sharding", "fsdp", "--json", str(out)]) == 0
    plan = es.Plan.from_json(out)
    assert plan.sharding in ("fsdp", "none") and (plan.sharding == "none") == (plan.dp == 1)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main([*PLAN_7B, "--sharding", "zero3"])
    err = capsys.readouterr().err
    assert "--sharding: expected a comma-separated list of none, zero1, zero2, fsdp" in err


def test_interleaving_shows_in_the_plan_and_can_be_turned_off(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A plan interleaved after the search says so, with what it cost without;
    `--interleave-after none` keeps the proven plan; `--virtual-stages 1,2` searches
    interleaving exactly; bad lists are refused naming the flag."""
    from espresso.cli.report import proof_words

    words = proof_words({"gap": 0.0, "interleaving": {
        "virtual_stages": 2, "total_usd_without": 1234.5, "total_hours_without": 10.0}})
    assert words.startswith("proven optimal without interleaving; interleaved (2 stages per "
                            "GPU group) from $1,234.50")
    out = tmp_path / "p.json"
    assert main([*PLAN_7B, "--interleave-after", "none", "--json", str(out)]) == 0
    assert es.Plan.from_json(out).virtual_stages == 1
    # Proving interleaved plans is slower (docs/search.md): a short limit, the best so far.
    assert main([*PLAN_7B, "--virtual-stages", "1,2", "--no-compare", "--time-limit", "3",
                 "--json", str(out)]) == 0
    assert es.Plan.from_json(out).virtual_stages in (1, 2)
    capsys.readouterr()
    for flag, bad, what in (("--interleave-after", "1", "expected 'none' or a comma-separated"),
                            ("--interleave-after", "2,x", "expected 'none' or a comma-separated"),
                            ("--virtual-stages", "none", "expected a comma-separated"),
                            ("--virtual-stages", "0", "expected a comma-separated")):
        with pytest.raises(SystemExit):
            main([*PLAN_7B, flag, bad])
        assert f"{flag}: {what}" in capsys.readouterr().err


# ---------------------------------------------------------------------- exact inputs (issue 25)
SMALL = ["plan", "--model", "gpt3-1.3b", "--deadline", "7d", "--catalog", "builtin:gpus",
         "--time-limit", "10"]


@pytest.mark.parametrize(("extra", "words"), [
    (["--tokens", "1e9", "--iterations", "100"], "give --tokens or --iterations, not both"),
    (["--iterations", "1.5"], "job.iterations: expected a whole count, got '1.5'"),
    (["--tokens", "1.5"], "job.tokens: expected a whole count"),
    (["--tokens", "1e9", "--deadline=-1d"], "expected a positive duration, got '-1d'"),
])
def test_job_flags_are_read_exactly(extra: list[str], words: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, *extra]) == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value"), [
    ("--max-stages", "1,,2"), ("--max-stages", "4,"), ("--virtual-stages", "1,,2"),
    ("--interleave-after", ",2"), ("--sharding", "fsdp,,zero1"), ("--recompute", "none,"),
    ("--deadline", "-1d")])
def test_lists_with_empty_items_and_negative_values(flag: str, value: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """An empty item is refused, not dropped; '-1d' is a value (refused by its check), not
    argparse's 'expected one argument'."""
    argv = [*SMALL, "--tokens", "1e9", flag, value]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's type check
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2
    assert flag in err or "duration" in err
    assert "expected one argument" not in err


def test_offers_filters_that_match_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    for flag, value, known in (("--provider", "nope", "aws"), ("--gpu", "H1000", "H100-SXM"),
                               ("--region", "nowhere-*", "ap-northeast-1")):
        assert main(["offers", flag, value]) == 2
        err = capsys.readouterr().err
        assert f"{flag} '{value}'" in err and known in err
    assert main(["offers", "--provider", "aws", "--region", "us-*", "--gpu", "H100-SXM"]) == 0
    assert "p5.48xlarge" in capsys.readouterr().out


def test_unknown_skypilot_provider(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A provider the package does not know is read (its defaults stated); a name that
    cannot be a provider is refused, named."""
    vms = tmp_path / "vms.csv"
    vms.write_text("InstanceType,AcceleratorName,AcceleratorCount,Price,Region\n"
                   "big,H100,8,20.0,r1\n")
    assert main(["offers", "--catalog", f"skypilot:nope={vms}"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "│ nope │ r1 │ big │ H100-SXM │" in out
    assert "provider 'nope' is not one the package knows" in out
    assert main(["gpus", "--catalog", f"skypilot:No Pe!={vms}"]) == 2
    assert "provider 'no pe!' is not a provider name" in capsys.readouterr().err


def test_export_reads_the_catalog_it_is_given(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "p.json"
    assert main(["plan", "--model", "gpt3-1.3b", "--tokens", "1e9", "--deadline", "7d",
                 "--json", str(plan)]) == 0
    capsys.readouterr()
    assert main(["export", "skypilot", str(plan), "--out", str(tmp_path / "sky"),
                 "--catalog", str(tmp_path / "nonexistent.yaml")]) == 2
    assert "nonexistent.yaml: no such file" in capsys.readouterr().err
    assert not (tmp_path / "sky").exists()


@pytest.mark.parametrize("port", ["-1", "0", "65536", "70000", "x"])
def test_ports_are_checked(port: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  - {address: 10.0.0.1, gpu: A100-80GB, gpus: 8}\n"
                     "  - {address: 10.0.0.2, gpu: L40S, gpus: 8}\n")
    for argv in (["launch", str(EXAMPLE), "--hosts", str(hosts), f"--port={port}"],
                 ["export", "skypilot", str(EXAMPLE), "--out", str(tmp_path / "s"),
                  f"--port={port}"]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "expected a port from 1 to 65535" in capsys.readouterr().err
    assert main(["launch", str(EXAMPLE), "--hosts", str(hosts), "--port", "65535"]) == 0
    out = capsys.readouterr().out
    # One port: torchrun's store and the process group share it.
    assert "--master-port=65535 " in out and "MASTER_PORT" not in out
    from espresso.runner.launch import LaunchError, load_hosts, torchrun_commands

    with pytest.raises(LaunchError, match="master_port"):
        torchrun_commands("p.json", es.Plan.from_json(EXAMPLE), load_hosts(hosts), "t.py",
                          master_port=-5)


def test_plan_json_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    """`--json -` prints the plan alone on stdout (the report goes to stderr), as
    `estimate --json -` does; it never writes a file named '-'."""
    assert main(["plan", "--model", "gpt3-1.3b", "--tokens", "1e9", "--deadline", "7d",
                 "--json", "-"]) == 0
    cap = capsys.readouterr()
    assert es.Plan.from_dict(json.loads(cap.out)).job.model.name == "gpt3-1.3b"
    assert "Total:" in cap.err
    assert not Path("-").exists()


def test_frontier_json_is_deterministic(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["frontier", "--model", "gpt3-1.3b", "--tokens", "1e9", "--catalog",
            "builtin:gpus", "--max-points", "3"]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main([*argv, "--json", str(a)]) == 0
    assert main([*argv, "--json", str(b), "--threads", "1"]) == 0
    assert a.read_bytes() == b.read_bytes()
    assert main([*argv, "--json", str(b), "--stats"]) == 0
    assert "seconds" in json.loads(b.read_text())


def test_threads_above_the_cores_are_capped(capsys: pytest.CaptureFixture[str]) -> None:
    from espresso.search import usable_cores

    assert main(["plan", "--model", "gpt3-1.3b", "--tokens", "1e9", "--deadline", "7d",
                 "--catalog", "builtin:gpus", "--threads", "100000"]) == 0
    out = capsys.readouterr().out
    assert (f"--threads 100000 is more than the {usable_cores()} cores this process may use"
            in " ".join(out.split()))
    assert f"on {usable_cores()} thread" in out
    assert main(["plan", "--model", "gpt3-1.3b", "--tokens", "1e9", "--deadline", "7d",
                 "--threads", "0"]) == 2
    assert "--threads: expected a count >= 1" in capsys.readouterr().err


def test_tight_stages_are_flagged_and_headroom_is_settable(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The prototype's instance at sequence 3800 fills stage 1 to 98% of usable memory: the
    plan flags it with its margin. --memory-headroom keeps more free, over the engine's
    profile (which it and --checkpoint-gbs no longer replace with the defaults)."""
    from espresso.cli.report import _margin

    argv = ["plan", "--model", "open_llama_3b_v2", "--iterations", "1000", "--seq-len", "3800",
            "--global-batch", "64", "--deadline", "100000s", "--catalog",
            str(Path(__file__).parents[1] / "examples/catalogs/espresso-prototype.yaml")]
    assert main([*argv, "--json", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    a = es.Plan.from_json(tmp_path / "a.json")
    assert a.estimate is not None
    tight = [i for i, s in enumerate(a.estimate.stages) if s.memory_gb > 0.9 * s.capacity_gb]
    assert tight == [1]
    st = a.estimate.stages[1]
    assert f"{st.memory_gb:.1f} / {st.capacity_gb:.1f} GB !" in out
    assert "Memory: 1 stage(s) above 90% of usable" in out
    assert f"stage 1 {_margin(st.capacity_gb - st.memory_gb)}" in out
    assert _margin(0.0234) == "23 MB" and _margin(0.1) == "0.1 GB"  # thin margins in MB
    assert main([*argv, "--memory-headroom", "0.2", "--json", str(tmp_path / "b.json")]) == 0
    capsys.readouterr()
    b = es.Plan.from_json(tmp_path / "b.json")
    assert b.cost_model.memory_reserve_fraction == 0.2
    assert b.cost_model.memory_bandwidth_efficiency == 0.15  # the torch-native profile kept
    assert b.estimate is not None
    assert b.estimate.stages[0].capacity_gb < a.estimate.stages[0].capacity_gb
    with pytest.raises(SystemExit):
        main([*argv, "--memory-headroom", "1.5"])
    assert "expected a fraction in [0, 1)" in capsys.readouterr().err
