"""espresso.train's torch-free parts: tokenizers, sources and packing, the options and their
learning-rate schedule, the metrics file (written and read back), and `espresso compare`'s
arithmetic on a metrics file written here."""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

import espresso as es
from espresso.errors import TrainError
from espresso.train import data as td
from espresso.train.compare import compare
from espresso.train.metrics import MetricsWriter, read_metrics
from espresso.train.options import TrainOptions, add_arguments, from_args, to_argv

ROOT = Path(__file__).parents[1]
TEXT = ROOT / "examples" / "data" / "espresso.txt"


def batches(source: object, seq: int = 16, batch: int = 4, vocab: int = 264,
            skip: int = 0) -> td.Batches:
    return td.Batches(source, seq_len=seq, global_batch=batch, vocab_size=vocab, skip=skip)


def test_byte_tokenizer_round_trips_and_ends_documents() -> None:
    tok = td.ByteTokenizer()
    ids = tok.encode("crème")
    assert ids.tolist() == list("crème".encode())
    assert tok.decode(ids) == "crème"
    src = td.TextSource(TEXT, tok)
    (doc,) = list(src.documents())
    assert doc[-1] == tok.eos_id
    assert tok.decode(doc[:-1]) == TEXT.read_text()


def test_packing_shifts_targets_and_chains_sequences() -> None:
    """Targets are inputs shifted by one; each sequence starts with the last token of the one
    before (stride seq_len), so the stream is covered without gaps."""
    tok = td.ByteTokenizer()
    stream = np.concatenate(list(td.TextSource(TEXT, tok).documents()))
    b = batches(td.TextSource(TEXT, tok), seq=16, batch=3)
    x, y = b.next()
    assert x.shape == y.shape == (3, 16)
    assert (x[:, 1:] == y[:, :-1]).all()
    for k in range(3):
        assert x[k].tolist() == stream[16 * k:16 * k + 16].tolist()
        assert y[k].tolist() == stream[16 * k + 1:16 * k + 17].tolist()
    assert b.position == 3


def test_a_finite_source_starts_again_as_the_next_epoch() -> None:
    tok = td.ByteTokenizer()
    n = len(TEXT.read_bytes()) + 1  # the text and its end-of-text
    b = batches(td.TextSource(TEXT, tok), seq=64, batch=8)
    steps = math.ceil(n / (64 * 8)) + 1
    for _ in range(steps):
        b.next()
    assert b.epoch >= 1


@pytest.mark.parametrize("kind", ["text", "npy", "bin", "synthetic"])
def test_skipping_reaches_the_same_batches_as_reading(kind: str, tmp_path: Path) -> None:
    """A resumed run skips the sequences its checkpoint consumed and then reads exactly what
    the uninterrupted run read next."""
    tok = td.ByteTokenizer()
    stream = np.concatenate(list(td.TextSource(TEXT, tok).documents()))

    def source() -> object:
        if kind == "text":
            return td.TextSource(TEXT, tok)
        if kind == "npy":
            np.save(tmp_path / "t.npy", stream.astype(np.uint16))
            return td.TokenFileSource(tmp_path / "t.npy")
        if kind == "bin":
            stream.astype(np.uint32).tofile(tmp_path / "t.bin")
            return td.TokenFileSource(tmp_path / "t.bin", "uint32")
        return td.SyntheticSource(264, seed=3)

    straight = batches(source(), batch=5)
    for _ in range(7):  # past the end of the file: the second epoch too
        straight.next()
    want = straight.next()
    resumed = batches(source(), batch=5, skip=35)
    got = resumed.next()
    assert (got[0] == want[0]).all() and (got[1] == want[1]).all()


def test_token_files_are_read_as_written(tmp_path: Path) -> None:
    toks = np.arange(100, dtype=np.uint16)
    toks.tofile(tmp_path / "t.bin")
    x, y = batches(td.TokenFileSource(tmp_path / "t.bin"), seq=10, batch=2, vocab=200).next()
    assert x[0].tolist() == list(range(10)) and y[1].tolist() == list(range(11, 21))


def test_synthetic_tokens_count_up() -> None:
    x, y = batches(td.SyntheticSource(264, seed=0), vocab=264).next()
    assert ((x + 1) % 264 == y).all()


def test_jsonl_documents_and_their_field(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text('{"text": "ab"}\n\n{"text": "c"}\n')
    tok = td.ByteTokenizer()
    docs = [d.tolist() for d in td.TextSource(f, tok).documents()]
    assert docs == [[97, 98, 256], [99, 256]]
    f.write_text('{"body": "ab"}\n')
    with pytest.raises(TrainError, match=r"d.jsonl:1: expected a string field 'text'"):
        list(td.TextSource(f, tok).documents())
    f.write_text("{not json\n")
    with pytest.raises(TrainError, match=r"d.jsonl:1: not a JSON object"):
        list(td.TextSource(f, tok).documents())


def test_bad_data_is_refused_with_what_was_expected(tmp_path: Path) -> None:
    tok = td.ByteTokenizer()
    with pytest.raises(TrainError, match="is not a file or folder"):
        td.open_source(str(tmp_path / "nope.txt"), tokenizer=tok, vocab_size=264, seed=0)
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(TrainError, match="unknown kind of file"):
        td.open_source(str(tmp_path / "x.parquet"), tokenizer=tok, vocab_size=264, seed=0)
    (tmp_path / "odd.bin").write_bytes(b"abc")
    with pytest.raises(TrainError, match="not a whole number of uint16 tokens"):
        td.TokenFileSource(tmp_path / "odd.bin")
    np.array([5, 300, 7] * 20, dtype=np.uint16).tofile(tmp_path / "big.bin")
    with pytest.raises(TrainError, match="token id 300, outside the model's vocabulary of 264"):
        batches(td.TokenFileSource(tmp_path / "big.bin"), seq=8, batch=1).next()
    (tmp_path / "sub").mkdir()
    with pytest.raises(TrainError, match="holds no text files"):
        td.TextSource(tmp_path / "sub", tok)
    with pytest.raises(TrainError, match="vocabulary of 200"):
        td.check_tokenizer(type("T", (), {"name": "t", "vocab_size": 300, "eos_id": 0})(),
                           200, "m")
    with pytest.raises(TrainError, match="--eos-id goes with --tokenizer"):
        td.open_tokenizer(None, 3)
    with pytest.raises(TrainError, match="give the model's tokenizer"):
        td.open_source("hf:wikitext:wikitext-2-raw-v1", tokenizer=tok, vocab_size=264, seed=0)


def test_warmup_then_cosine_to_the_floor() -> None:
    o = TrainOptions(plan="p", data="d", lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    assert o.lr_at(0, 100) == pytest.approx(1e-4)
    assert o.lr_at(9, 100) == pytest.approx(1e-3)
    assert o.lr_at(10, 100) == pytest.approx(1e-3)
    assert o.lr_at(55, 100) == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert o.lr_at(100, 100) == pytest.approx(1e-4)
    lrs = [o.lr_at(s, 100) for s in range(10, 100)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))
    assert TrainOptions(plan="p", data="d").warmup(100) == 5


def test_options_survive_the_command_line() -> None:
    """--local hands the options to every rank as arguments: they come back the same."""
    p = argparse.ArgumentParser()
    add_arguments(p)
    argv = ["plan.json", "--data", "x.txt", "--steps", "7", "--lr", "0.002", "--clip", "0",
            "--no-track-activations", "--compile", "--local", "--checkpoint-every", "0"]
    opts = from_args(p.parse_args(argv))
    again = from_args(p.parse_args([*to_argv(opts, drop=("local",)), "--local"]))
    assert again == opts
    assert opts.checkpoint_every == 0 and opts.track_activations is False
    with pytest.raises(SystemExit):
        p.parse_args(["plan.json", "--data", "x", "--lr", "-1"])


def _header(plan_path: Path, plan: es.Plan, device: str = "cuda") -> dict[str, object]:
    return {"plan": str(plan_path), "model": plan.job.model.name,
            "stages": [{"gpu": s.gpu, "tp": s.tp, "layers": list(s.layers)}
                       for s in plan.stages],
            "dp": plan.dp, "world_size": plan.num_gpus, "device": device,
            "device_name": "GPU", "precision": "bf16", "reference": False,
            "tokens_per_step": plan.job.global_batch_size * plan.job.seq_len}


def test_metrics_round_trip_and_compare_arithmetic(tmp_path: Path) -> None:
    """A run measured at twice the predicted step time: compare reports 2x the time, half the
    tokens/s and MFU, and the job's hours and dollars at that speed; memory per group is the
    largest over the timed steps."""
    plan = es.Plan.from_json(ROOT / "examples" / "plans" / "tiny-llama-uneven.json")
    plan = plan.with_estimate()
    est = plan.estimate
    assert est is not None and est.model_flops_per_iteration > 0 and est.peak_flops > 0
    pf = tmp_path / "plan.json"
    pf.write_text(plan.to_json())
    mf = tmp_path / "m.jsonl"
    w = MetricsWriter(mf, _header(pf, plan))
    step_s = 2 * est.iteration_s
    for k in range(5):
        mem = [{"stage": g, "peak_gb": 1.0 + k, "params_gb": 0.1, "grads_gb": 0.1,
                "optimizer_gb": 0.2, "activations_gb": None} for g in range(plan.pp)]
        w.write({"kind": "step", "step": k, "index_in_run": k, "loss": 5.0 - k,
                 "step_s": 100.0 if k < 2 else step_s, "memory": mem, "skipped": False})
    w.close()
    with open(mf, "a") as fh:
        fh.write('{"kind": "st')  # a line cut short by a killed run
    run = read_metrics(mf)
    assert [s["step"] for s in run.steps] == [0, 1, 2, 3, 4]
    c = compare(pf, mf, skip=2)
    rows = {r.what: r for r in c.speed}
    assert rows["iteration time"].ratio == pytest.approx(2.0)
    assert rows["tokens/s"].ratio == pytest.approx(0.5)
    assert rows["MFU"].measured == pytest.approx(est.mfu / 2)
    assert rows["job hours"].measured == pytest.approx(est.iterations * step_s / 3600)
    assert rows["job dollars"].measured == pytest.approx(
        est.iterations * step_s / 3600 * est.hourly_usd + est.transfer_usd)
    assert [g[0].measured for g in c.memory] == [5.0] * plan.pp
    assert c.memory[0][4].measured is None  # activations not tracked
    json.dumps(c.to_dict())


def test_compare_refuses_metrics_of_another_plan(tmp_path: Path) -> None:
    plan = es.Plan.from_json(ROOT / "examples" / "plans" / "tiny-llama-uneven.json")
    other = es.Plan.from_json(ROOT / "examples" / "plans" / "tiny-gpt-2x2.json")
    pf = tmp_path / "plan.json"
    pf.write_text(plan.to_json())
    mf = tmp_path / "m.jsonl"
    w = MetricsWriter(mf, _header(pf, other))
    w.write({"kind": "step", "step": 0, "loss": 1.0, "step_s": 1.0})
    w.close()
    with pytest.raises(TrainError, match="metrics are of a run of another plan"):
        compare(pf, mf)
    mf.write_text('{"kind": "run", "schema": "other/9"}\n')
    with pytest.raises(TrainError, match="schema 'other/9'"):
        read_metrics(mf)
    mf.write_text("")
    with pytest.raises(TrainError, match="no run line"):
        read_metrics(mf)


def test_a_local_hugging_face_tokenizer(tmp_path: Path) -> None:
    """A tokenizer.json (trained here on the example text): its ids, its end-of-text token
    found by name, and a model too small for its vocabulary refused."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel()
    tok.train([str(TEXT)], tokenizers.trainers.BpeTrainer(vocab_size=300,
                                                          special_tokens=["<unk>", "</s>"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    t = td.open_tokenizer(str(tmp_path))  # the folder holding it
    assert t.eos_id == 1 and t.vocab_size == 300
    ids = t.encode("Espresso is coffee")
    assert ids.tolist() == tok.encode("Espresso is coffee").ids
    with pytest.raises(TrainError, match="has 300 ids but the model 'm' has a vocabulary"):
        td.check_tokenizer(t, 264, "m")
    with pytest.raises(TrainError, match="--eos-id: expected an id below"):
        td.open_tokenizer(str(tmp_path / "tokenizer.json"), eos_id=999)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(TrainError, match="cannot read"):
        td.open_tokenizer(str(tmp_path / "bad.json"))


def test_calibrate_from_a_run_recovers_the_engine_rate(tmp_path: Path) -> None:
    """A run whose steps take what the estimate gives at sustained_fraction 0.5: calibrate
    --from-run finds 0.5 and writes a cost model that `espresso plan --cost-model` reads;
    with it the plan's estimate is the run's step time. A CPU rehearsal of a GPU plan is
    refused."""
    from dataclasses import replace

    from espresso.cli import main
    from espresso.cli._common import load_cost_model

    plan = es.Plan.from_json(ROOT / "examples" / "plans" / "tiny-llama-uneven.json")
    pf = tmp_path / "plan.json"
    pf.write_text(plan.to_json())
    slow = es.estimate(plan, cost_model=replace(es.CostParams(), sustained_fraction=0.5))
    mf = tmp_path / "m.jsonl"
    w = MetricsWriter(mf, {**_header(pf, plan), "engine": "espresso"})
    for k in range(6):
        w.write({"kind": "step", "step": k, "index_in_run": k, "loss": 1.0,
                 "step_s": 10.0 if k < 2 else slow.iteration_s})
    w.close()
    out = tmp_path / "cost.yaml"
    assert main(["calibrate", "--from-run", str(mf), "--out", str(out)]) == 0
    cost = load_cost_model(str(out))
    assert cost is not None and cost.sustained_fraction == pytest.approx(0.5, rel=1e-3)
    assert es.estimate(plan, cost_model=cost).iteration_s == pytest.approx(slow.iteration_s,
                                                                           rel=1e-3)
    cpu = tmp_path / "cpu.jsonl"
    w = MetricsWriter(cpu, {**_header(pf, plan, device="cpu")})
    w.write({"kind": "step", "step": 0, "loss": 1.0, "step_s": 1.0})
    w.close()
    from espresso.calibrate import from_run

    with pytest.raises(es.CatalogError, match="CPU rehearsal of a plan for A100-80GB, L40S"):
        from_run(plan, read_metrics(cpu))
    assert main(["calibrate", "--from-run", str(cpu), "--out", str(tmp_path / "x.yaml")]) == 2
