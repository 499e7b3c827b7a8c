"""Measuring profiles with PyTorch on the CPU: presets as modules, the profiler, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import espresso as es  # noqa: E402
from espresso.cli import main  # noqa: E402
from espresso.modules import build_block, build_head  # noqa: E402
from espresso.profile import profile_model  # noqa: E402

pytestmark = pytest.mark.torch

TINY = es.ModelSpec(name="tiny-llama", num_layers=4, hidden_size=128, num_heads=4,
                    num_kv_heads=2, ffn_hidden_size=344, vocab_size=500, gated_mlp=True)


@pytest.mark.parametrize("name", es.ModelSpec.preset_names())
def test_preset_modules_have_the_counted_parameters(name: str) -> None:
    spec = es.ModelSpec.preset(name)
    with torch.device("meta"):
        block, head = build_block(spec), build_head(spec)
    assert sum(p.numel() for p in block.parameters()) == spec.params_per_block
    assert sum(p.numel() for p in head.out.parameters()) == spec.vocab_size * spec.hidden_size


def test_profile_a_tiny_model_on_the_cpu() -> None:
    prof = profile_model(TINY, gpu="L4", seq_len=64, micro_batch_size=2, warmup=1, repeats=3)
    assert prof.device.startswith("cpu") and prof.dtype == "float32"
    assert all(len(v) == 3 for v in prof.samples.values())
    assert prof.block_fwd_s == sorted(prof.samples["block_fwd"])[1]  # the median
    assert prof.block_param_bytes == 4 * TINY.params_per_block
    # Saved activations of one block in fp32, against the bf16 formula (which also counts
    # dropout masks this dropout-free module does not have): about twice, never below.
    f = prof.factors(TINY, es.Catalog.builtin("gpus")["L4"], es.CostParams())
    assert 1.2 < f["activation_scale"] < 4, f
    # The estimate of a plan on the profiled type uses the measured block time.
    job = es.Job(model=TINY, seq_len=64, global_batch_size=8, iterations=10, deadline_hours=1)
    plan = es.Plan(job=job, stages=(es.Stage(gpu="L4", layers=(0, 2)),
                                    es.Stage(gpu="L4", layers=(2, 4))),
                   micro_batch_size=2, num_microbatches=4, profiles={"L4": prof})
    assert es.estimate(plan).stages[0].fwd_s == pytest.approx(2 * prof.block_fwd_s, rel=1e-9)


def test_profile_cli_then_plan_and_estimate_with_it(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "tiny.yaml"
    model.write_text(json.dumps(TINY.to_dict()))
    out = tmp_path / "l4.json"
    assert main(["profile", "--model", str(model), "--gpu", "L4", "--seq-len", "64",
                 "--repeats", "2", "--warmup", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "block forward" in text and "measured / analytic" in text
    prof = es.Profile.load(out)
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({"model": TINY.to_dict(), "seq_len": 64, "global_batch_size": 8,
                               "iterations": 1000, "deadline_hours": 24}))
    plan_json = tmp_path / "plan.json"
    cat = tmp_path / "cat.yaml"
    l4 = es.Catalog.builtin("gpus")["L4"].to_dict()
    cat.write_text(json.dumps({"gpus": [{**l4, "count": 4}]}))
    assert main(["plan", "--job", str(job), "--catalog", str(cat), "--profile",
                 f"L4={out}", "--json", str(plan_json)]) == 0
    plan = es.Plan.from_json(plan_json)
    assert plan.profiles == {"L4": prof}
    # Without the profile the same plan estimates differently; with it, as planned.
    assert es.estimate(plan).iteration_s == plan.estimate.iteration_s  # type: ignore[union-attr]
    bare = es.Plan.from_dict({k: v for k, v in plan.to_dict().items() if k != "profiles"})
    assert es.estimate(bare).iteration_s < plan.estimate.iteration_s  # type: ignore[union-attr]
    capsys.readouterr()
    assert main(["estimate", str(plan_json), "--catalog", str(cat), "--profile",
                 f"T4={out}"]) == 2
    assert "the file is a profile of L4, not T4" in capsys.readouterr().err


@pytest.mark.parametrize(("extra", "words"), [
    (["--device", "nope"], "'nope' is not a torch device"),
    (["--device", "cuda:7"], "cuda:7"),
    (["--micro-batch", "0"], "--micro-batch 0 is out of range"),
    (["--seq-len", "0"], "--seq-len 0 is out of range"),
    (["--repeats", "0"], "--repeats 0 is out of range"),
    (["--warmup=-1"], "--warmup -1 is out of range"),
])
def test_profile_refuses_bad_sizes_and_devices_before_the_work(
        extra: list[str], words: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if extra[-1] == "cuda:7" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    out = tmp_path / "p.json"
    assert main(["profile", "--model", "gpt3-1.3b", "--gpu", "A100-80GB", "--out", str(out),
                 *extra]) == 2
    assert words in capsys.readouterr().err
    assert not out.exists()  # no profile of another size than asked
    with pytest.raises(es.ProfileError):
        profile_model(es.ModelSpec.preset("gpt3-1.3b"), gpu="A100-80GB", seq_len=0,
                      device="cpu")
