"""The event simulation of 1F1B and GPipe against closed forms and bounds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from espresso import _core

ONE_F_ONE_B = _core.Schedule.ONE_F_ONE_B
GPIPE = _core.Schedule.GPIPE
SCHEDULES = st.sampled_from([ONE_F_ONE_B, GPIPE])
TIME = st.floats(min_value=1e-3, max_value=10.0, allow_nan=False, allow_infinity=False)


def sim(f: list[float], b: list[float], m: int, schedule: object,
        c: list[float] | None = None) -> float:
    c = [0.0] * (len(f) - 1) if c is None else c
    return _core.simulate_pipeline(f, b, c, c, m, schedule).makespan_s


def lower_bound(f: list[float], b: list[float], m: int) -> float:
    """Valid for any schedule: one micro-batch's full pass; and each stage k's own work
    M*(f_k+b_k) after the first forward reaches it and before the last backward leaves."""
    chain = sum(f) + sum(b)
    per_stage = max(sum(f[:k]) + m * (f[k] + b[k]) + sum(b[:k]) for k in range(len(f)))
    return max(chain, per_stage)


@settings(max_examples=200, deadline=None)
@given(p=st.integers(1, 12), m=st.integers(1, 40), f=TIME, ratio=st.floats(0.5, 3.0),
       schedule=SCHEDULES)
def test_uniform_stages_free_transfers_equal_closed_form(p: int, m: int, f: float, ratio: float,
                                                         schedule: object) -> None:
    fs, bs = [f] * p, [f * ratio] * p
    expected = _core.closed_form_s(fs, bs, m)  # (M + P - 1) * (f + b)
    assert expected == pytest.approx((m + p - 1) * (f + f * ratio))
    assert sim(fs, bs, m, schedule) == pytest.approx(expected, rel=1e-9)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), p=st.integers(1, 8), m=st.integers(1, 24))
def test_gpipe_never_below_closed_form(data: st.DataObject, p: int, m: int) -> None:
    fs = data.draw(st.lists(TIME, min_size=p, max_size=p))
    bs = data.draw(st.lists(TIME, min_size=p, max_size=p))
    cs = data.draw(st.lists(st.floats(0, 1.0), min_size=p - 1, max_size=p - 1))
    closed = _core.closed_form_s(fs, bs, m)
    assert sim(fs, bs, m, GPIPE, cs) >= closed * (1 - 1e-12)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), p=st.integers(1, 8), m=st.integers(1, 24), schedule=SCHEDULES)
def test_never_below_the_true_lower_bound(data: st.DataObject, p: int, m: int,
                                          schedule: object) -> None:
    fs = data.draw(st.lists(TIME, min_size=p, max_size=p))
    bs = data.draw(st.lists(TIME, min_size=p, max_size=p))
    cs = data.draw(st.lists(st.floats(0, 1.0), min_size=p - 1, max_size=p - 1))
    assert sim(fs, bs, m, schedule, cs) >= lower_bound(fs, bs, m) * (1 - 1e-12)
    # Transfers only delay: the makespan with them is never below the one without.
    assert sim(fs, bs, m, schedule, cs) >= sim(fs, bs, m, schedule) * (1 - 1e-12)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), p=st.integers(1, 6), m=st.integers(1, 16), schedule=SCHEDULES)
def test_busy_time_and_bubble(data: st.DataObject, p: int, m: int, schedule: object) -> None:
    fs = data.draw(st.lists(TIME, min_size=p, max_size=p))
    bs = data.draw(st.lists(TIME, min_size=p, max_size=p))
    r = _core.simulate_pipeline(fs, bs, [0.0] * (p - 1), [0.0] * (p - 1), m, schedule)
    assert r.busy_s == pytest.approx([m * (f + b) for f, b in zip(fs, bs, strict=True)])
    assert r.makespan_s >= max(r.busy_s) * (1 - 1e-12)
    assert 0.0 <= r.bubble_fraction < 1.0


def test_1f1b_can_beat_the_closed_form() -> None:
    # A slow first stage and a fast second: 1F1B overlaps the second stage's work for the
    # last micro-batch with the first stage's remaining backward, so the makespan is the
    # first stage's busy time 5 * 20 = 100 s, below the closed form 22 + 4 * 20 = 102 s.
    # The closed form is therefore a check, not a bound, for 1F1B (it is one for GPipe).
    assert sim([10, 1], [10, 1], 5, ONE_F_ONE_B) == pytest.approx(100.0)
    assert _core.closed_form_s([10, 1], [10, 1], 5) == pytest.approx(102.0)
    assert sim([10, 1], [10, 1], 5, GPIPE) == pytest.approx(102.0)


def test_in_flight() -> None:
    assert [_core.in_flight(ONE_F_ONE_B, i, 4, 8) for i in range(4)] == [4, 3, 2, 1]
    # Fewer micro-batches than stages: 1F1B runs as GPipe (PyTorch's 1F1B needs one per stage).
    assert [_core.in_flight(ONE_F_ONE_B, i, 4, 2) for i in range(4)] == [2, 2, 2, 2]
    assert [_core.in_flight(ONE_F_ONE_B, i, 4, 1) for i in range(4)] == [1, 1, 1, 1]
    assert _core.in_flight(GPIPE, 0, 4, 8) == 8


@pytest.mark.parametrize(
    ("f", "b", "c", "m", "match"),
    [
        ([], [], [], 1, "number of stages"),
        ([1.0], [1.0], [], 0, "num_microbatches"),
        ([1.0], [1.0], [], 1 << 21, "num_microbatches"),
        ([1.0] * 8, [1.0] * 8, [0.0] * 7, 1 << 20, "stages \\* microbatches"),
        ([1.0, 1.0], [1.0], [0.0], 2, "expected P forward"),
        ([1.0, 1.0], [1.0, 1.0], [], 2, "expected P forward"),
        ([float("nan")], [1.0], [], 2, "fwd_s"),
        ([1.0], [-1.0], [], 2, "bwd_s"),
        ([1.0, 1.0], [1.0, 1.0], [float("inf")], 2, "send_fwd_s"),
    ],
)
def test_bad_input_raises(f: list[float], b: list[float], c: list[float], m: int,
                          match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _core.simulate_pipeline(f, b, c, c, m, ONE_F_ONE_B)


# ---------------------------------------------------------------- interleaved 1F1B
@pytest.mark.parametrize(("p", "v", "m"), [(4, 2, 8), (4, 4, 8), (8, 2, 16), (2, 3, 4),
                                           (4, 2, 4), (3, 5, 9)])
def test_interleaved_matches_its_closed_form(p: int, v: int, m: int) -> None:
    """Uniform devices (f = 1, b = 2 per micro-batch, in v equal chunks), free transfers:
    Narayanan et al. 2021, sec. 2.2.2, the bubble shrinks by v: M (f+b) + (P-1)(f+b)/v."""
    s = p * v
    got = _core.interleaved_makespan([1.0 / v] * s, [2.0 / v] * s, [0.0] * (s - 1),
                                     [0.0] * (s - 1), p, m)
    assert got == pytest.approx(m * 3.0 + (p - 1) * 3.0 / v, rel=1e-12)
    assert got < sim([1.0] * p, [2.0] * p, m, ONE_F_ONE_B)  # below plain 1F1B's


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.integers(2, 3), st.integers(1, 3), st.data())
def test_interleaved_abort_only_stops_what_would_exceed(p: int, v: int, groups: int,
                                                       data: st.DataObject) -> None:
    """With abort_above, the simulation returns the makespan when it is within the limit and
    +infinity only when it is beyond (the placer stops hopeless leaves this way)."""
    s, m = p * v, p * groups
    f = data.draw(st.lists(TIME, min_size=s, max_size=s))
    b = data.draw(st.lists(TIME, min_size=s, max_size=s))
    c = data.draw(st.lists(st.floats(0, 1), min_size=s - 1, max_size=s - 1))
    full = _core.interleaved_makespan(f, b, c, c, p, m)
    # (The check sums remaining work in another order than the simulation: callers leave a
    # relative slack, as the placer does, so a limit of exactly the makespan may stop it.)
    for limit in (full * 0.5, full * (1 - 1e-6), full * (1 + 1e-9), full * 1.5):
        got = _core.interleaved_makespan(f, b, c, c, p, m, limit)
        assert got == (full if full <= limit else math.inf)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5), st.integers(2, 4), st.integers(1, 4), st.data())
def test_interleaved_is_above_every_device_and_every_chain(p: int, v: int, groups: int,
                                                           data: st.DataObject) -> None:
    """Any times and transfers: no deadlock; the makespan covers each device's own work and
    one micro-batch's whole forward and backward through every virtual stage."""
    s, m = p * v, p * groups
    f = data.draw(st.lists(TIME, min_size=s, max_size=s))
    b = data.draw(st.lists(TIME, min_size=s, max_size=s))
    c = data.draw(st.lists(st.floats(0.0, 5.0), min_size=s - 1, max_size=s - 1))
    got = _core.interleaved_makespan(f, b, c, c, p, m)
    for d in range(p):
        busy = m * sum(f[k * p + d] + b[k * p + d] for k in range(v))
        assert got >= busy * (1 - 1e-12)
    assert got >= (sum(f) + sum(b) + 2 * sum(c)) * (1 - 1e-12)


# ------------------------------------------- interleaved 1F1B with DP collectives
@pytest.mark.parametrize(("p", "v", "m"), [(4, 2, 4), (4, 3, 8), (8, 4, 8), (2, 2, 6)])
@pytest.mark.parametrize("share", [0.0, 0.05, 0.25, 0.5, 1.0])
def test_interleaved_reductions_hide_under_the_later_chunks_backwards(p: int, v: int, m: int,
                                                                      share: float) -> None:
    """Uniform chunks (f = 1, b = 2 per micro-batch over v chunks), free transfers, each
    chunk's gradient reduction taking x, up to the P backwards (2P/v) between two launches:
    launched as the chunk's last backward starts, it runs under the backwards after it, so only
    chunk 0's, launched at the start of the device's last backward, can outlast the pipeline:
    by x - 2/v. The pipeline itself does not move."""
    s, x = p * v, share * 2.0 * p / v
    f, b, c = [1.0 / v] * s, [2.0 / v] * s, [0.0] * (s - 1)
    base = _core.interleaved_makespan(f, b, c, c, p, m)
    makespan, tails = _core.interleaved_run(f, b, c, c, p, m, under_backward=[x] * s)
    assert makespan == pytest.approx(base, rel=1e-12)
    for tail in tails:
        assert tail == pytest.approx(max(0.0, x - 2.0 / v), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize(("p", "v", "m"), [(4, 2, 4), (4, 3, 8), (2, 2, 6)])
@pytest.mark.parametrize("g", [0.0, 0.2, 1.0, 4.0])
def test_interleaved_gather_stalls_the_first_forward_it_feeds(p: int, v: int, m: int,
                                                              g: float) -> None:
    """One gather of g on device 0's first chunk (the first operation of the whole schedule,
    which every other one waits on): the makespan moves by exactly what the gather outlasts
    that forward, and nothing runs past the pipeline."""
    s = p * v
    f, b, c = [1.0 / v] * s, [2.0 / v] * s, [0.0] * (s - 1)
    base = _core.interleaved_makespan(f, b, c, c, p, m)
    gathers = [g] + [0.0] * (s - 1)
    makespan, tails = _core.interleaved_run(f, b, c, c, p, m, under_forward=gathers)
    assert makespan == pytest.approx(base + max(0.0, g - 1.0 / v), rel=1e-12)
    assert tails == [0.0] * p


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 4), st.integers(2, 3), st.integers(1, 3), st.data())
def test_interleaved_collectives_bounds(p: int, v: int, groups: int,
                                        data: st.DataObject) -> None:
    """Any times and traffic: every device's tail holds its exposed collectives and at most
    everything it has to send; a reduction that cannot hide shows; more traffic never makes
    the step shorter; the gathers never shorten the pipeline, and delay it by at most their
    sum on the busiest device."""
    s, m = p * v, p * groups
    f = data.draw(st.lists(TIME, min_size=s, max_size=s))
    b = data.draw(st.lists(TIME, min_size=s, max_size=s))
    c = data.draw(st.lists(st.floats(0.0, 1.0), min_size=s - 1, max_size=s - 1))
    comm = st.lists(st.floats(0.0, 5.0), min_size=s, max_size=s)
    rb, gf, ex = data.draw(comm), data.draw(comm), data.draw(comm)
    base = _core.interleaved_makespan(f, b, c, c, p, m)
    makespan, tails = _core.interleaved_run(f, b, c, c, p, m, rb, gf, ex)
    assert makespan >= base * (1 - 1e-12)
    assert makespan <= base + max(sum(gf[k * p + d] for k in range(v)) for d in range(p)) + 1e-9
    for d in range(p):
        mine = range(d, s, p)
        assert tails[d] >= sum(ex[i] for i in mine) * (1 - 1e-12)
        assert tails[d] >= rb[d] - b[d] - 1e-9  # chunk 0's reduction: the device's last op
        assert tails[d] <= sum(rb[i] + gf[i] + ex[i] for i in mine) + 1e-9
    more = [x * 2 for x in rb]
    makespan2, tails2 = _core.interleaved_run(f, b, c, c, p, m, more, gf, ex)
    assert makespan2 == makespan
    assert all(t2 >= t * (1 - 1e-12) for t, t2 in zip(tails, tails2, strict=True))


def test_interleaved_run_refuses_malformed_traffic() -> None:
    f, b, c = [1.0] * 4, [2.0] * 4, [0.0] * 3
    with pytest.raises(ValueError, match="one time per virtual stage"):
        _core.interleaved_run(f, b, c, c, 2, 2, under_backward=[1.0])
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="finite and >= 0"):
            _core.interleaved_run(f, b, c, c, 2, 2, exposed=[0.0, 0.0, bad, 0.0])


@pytest.mark.parametrize(("s", "p", "m", "match"), [
    (4, 4, 4, "v >= 2"),            # one chunk per device: plain 1F1B
    (6, 4, 4, "virtual stages"),    # not a multiple of the devices
    (8, 4, 6, "multiple of the devices"),
    (8, 4, 2, "multiple of the devices"),
])
def test_interleaved_refuses_what_it_cannot_schedule(s: int, p: int, m: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _core.interleaved_makespan([1.0] * s, [1.0] * s, [0.0] * (s - 1), [0.0] * (s - 1), p, m)


def drain_bound(f: list[float], b: list[float], c: list[float], m: int) -> float:
    """The placer's warm-up/cool-down bound (``drain`` in placer.cpp): stage k starts after
    the fill x_k, works M (f_k + b_k), idles while its first backward and its last one wait
    for the round trip D_k through the later stages (less the nf_k - 1 forwards, resp.
    backwards, it can run meanwhile; two windows when M > nf_k), and the last gradient
    returns through the stages before it."""
    p = len(f)
    cin = [0.0, *c]  # the transfer into each stage
    best = 0.0
    for k in range(p):
        x = sum(f[i] + b[i] for i in range(k)) + 2 * sum(cin[1:k + 1])
        d = sum(f[i] + b[i] + 2 * cin[i] for i in range(k + 1, p))
        nf = min(p - k, m)
        warm, cool = max(0.0, d - (nf - 1) * f[k]), max(0.0, d - (nf - 1) * b[k])
        best = max(best, x + m * (f[k] + b[k]) + (warm + cool if m > nf else max(warm, cool)))
    return best


@settings(max_examples=400, deadline=None)
@given(data=st.data(), p=st.integers(1, 8))
def test_1f1b_never_below_the_drain_bound(data: st.DataObject, p: int) -> None:
    m = data.draw(st.integers(p, 32))  # 1F1B as the search runs it: M >= P
    fs = data.draw(st.lists(TIME, min_size=p, max_size=p))
    bs = data.draw(st.lists(TIME, min_size=p, max_size=p))
    cs = data.draw(st.lists(st.floats(0, 1.0), min_size=p - 1, max_size=p - 1))
    assert sim(fs, bs, m, ONE_F_ONE_B, cs) >= drain_bound(fs, bs, cs, m) * (1 - 1e-12)


def test_drain_bound_is_exact_for_equal_stages() -> None:
    for p, m in [(4, 4), (8, 32), (16, 280)]:
        fs, bs = [0.1] * p, [0.29] * p
        assert drain_bound(fs, bs, [0.0] * (p - 1), m) == pytest.approx(
            sim(fs, bs, m, ONE_F_ONE_B), rel=1e-12)


def window_mean(f: list[float], b: list[float], c: list[float]) -> float:
    """The largest mean over contiguous stages s..t of their work and inner transfers (both
    ways) per stage: 1F1B's steady-state period."""
    p, best = len(f), 0.0
    for s in range(p):
        for t in range(s, p):
            length = sum(f[s:t + 1]) + sum(b[s:t + 1]) + 2 * sum(c[s:t])
            best = max(best, length / (t - s + 1))
    return best


def chain_bound(f: list[float], b: list[float], c: list[float], m: int) -> float:
    """The placer's steady-state chain bound (``chain`` in placer.cpp)."""
    p, best = len(f), 0.0
    for t in range(p):
        x_t = sum(f[:t]) + sum(b[:t]) + 2 * sum(c[:t])
        for s in range(t + 1):
            nf, k = p - s, t - s + 1
            if m - 1 < nf:
                continue
            length = sum(f[s:t + 1]) + sum(b[s:t + 1]) + 2 * sum(c[s:t])
            best = max(best, x_t + f[t] + b[t] + ((m - 1 - nf) // k + 1) * length)
    return best


@settings(max_examples=400, deadline=None)
@given(data=st.data(), p=st.integers(1, 8))
def test_1f1b_never_below_the_chain_bound(data: st.DataObject, p: int) -> None:
    m = data.draw(st.integers(p, 40))
    fs = data.draw(st.lists(TIME, min_size=p, max_size=p))
    bs = data.draw(st.lists(TIME, min_size=p, max_size=p))
    cs = data.draw(st.lists(st.floats(0, 1.0), min_size=p - 1, max_size=p - 1))
    assert sim(fs, bs, m, ONE_F_ONE_B, cs) >= chain_bound(fs, bs, cs, m) * (1 - 1e-12)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), p=st.integers(2, 6))
def test_1f1b_steady_period_is_the_largest_window_mean(data: st.DataObject, p: int) -> None:
    fs = data.draw(st.lists(TIME, min_size=p, max_size=p))
    bs = data.draw(st.lists(TIME, min_size=p, max_size=p))
    cs = data.draw(st.lists(st.floats(0, 1.0), min_size=p - 1, max_size=p - 1))
    period = (sim(fs, bs, 800, ONE_F_ONE_B, cs) - sim(fs, bs, 400, ONE_F_ONE_B, cs)) / 400
    assert period == pytest.approx(window_mean(fs, bs, cs), rel=2e-3)
