"""The adaptive controller learns from the steps it runs: the step times measured during the answer replace the
load-time costs within a few steps, so it goes plain when verify forwards turn dear and comes back when they are cheap
again (an estimator fed synthetic times, a simulated world, and the engine with a hook that slows its verifies)."""

from __future__ import annotations

import sys
import time
import types

import torch

from localspec.engine.adaptive import RunningTime, VerifyCosts
from localspec.proposers.base import Draft, Proposer

PLAIN_S = 0.030


def test_the_running_estimate_follows_a_new_cost_within_a_few_steps_and_ignores_one_preempted_step():
    estimate = RunningTime()
    for _ in range(20):
        estimate.add(0.010)
    estimate.add(0.200)  # one step another process preempted
    assert abs(estimate.value - 0.010) < 1e-12
    for _ in range(6):  # the machine now takes 3× as long
        estimate.add(0.030)
    assert estimate.value > 0.010 + 0.8 * 0.020
    for _ in range(120):
        estimate.age(0.97)  # not measured for a while (other sizes ran): the next sample is what it costs now
    estimate.add(0.012)
    assert abs(estimate.value - 0.012) < 1e-12


def test_a_verify_that_changed_cost_asks_for_a_plain_step_to_measure_against():
    costs = VerifyCosts()
    costs.set_prior(PLAIN_S, PLAIN_S * 1.1, 5)  # timed at load: rows nearly free
    costs.add(1, PLAIN_S)
    for _ in range(5):
        costs.add(5, PLAIN_S * 1.1)
    assert not costs.plain_due() and abs(costs.plain_s() - PLAIN_S) < 1e-12
    for _ in range(3):
        costs.add(5, PLAIN_S * 3.0)  # rows turned dear (another program took the cores' vector units)
    assert costs.plain_due()
    costs.add(1, PLAIN_S)
    assert not costs.plain_due()
    for _ in range(80):  # only drafting steps for a long while: the plain step is measured again
        costs.add(5, PLAIN_S * 3.0)
    assert costs.plain_due()


class Oracle(Proposer):
    """Drafts the target's own greedy continuation (known from a plain run), at no cost: speculation pays unless
    the verify forwards are slow."""

    name = "ngram"  # the name of a free proposer the configuration knows

    def __init__(self, prompt: list[int], continuation: list[int]) -> None:
        self.known = prompt + continuation

    def propose(self, context_ids, k, sampling, noise):
        start = len(context_ids)
        return Draft(self.known[start : start + k], None)


def test_the_engine_goes_plain_within_a_few_steps_while_verify_forwards_are_slowed(tiny_models, monkeypatch):
    """The costs are on the step's clock, not the machine's: each forward reads 1 s longer than it ran, a slowed
    verify 20 s more, so the tiny model's own milliseconds (however loaded the machine) decide nothing."""
    from localspec.config import SamplingParams, SpecConfig
    from localspec.engine.loop import Engine

    step_module = sys.modules["localspec.engine.step"]  # the module (the package's `step` is its function)

    target, _ = tiny_models
    engine = Engine(target, stop_token_ids=set())
    prompt, sampling = [1, 72, 101, 108, 108, 111], SamplingParams(max_new_tokens=400)
    plain = [t.token_id for ev in engine.generate(prompt, sampling, SpecConfig(proposer="none")) for t in ev.tokens]
    runner, extend, slow, late = engine.target, engine.target.extend, {"on": False}, {"s": 0.0}
    clock = types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + late["s"])  # the step's clock
    monkeypatch.setattr(step_module, "synced_clock", lambda device: clock.perf_counter())
    monkeypatch.setattr(step_module, "time", clock)

    def slowed_extend(ids, *args, **kwargs):  # every forward reads 1 s longer, a slowed verify 20 s more
        late["s"] += 1.0 + (20.0 if slow["on"] and len(ids) > 1 else 0.0)
        return extend(ids, *args, **kwargs)

    runner.extend = slowed_extend
    spec = SpecConfig(proposer="ngram", k=4, adaptive=True)
    fast, slowed, emitted = [], [], []
    with torch.inference_mode():
        for event in engine.generate(prompt, sampling, spec, Oracle(prompt, plain)):
            emitted += [t.token_id for t in event.tokens]
            (fast if len(fast) < 30 else slowed).append(event)
            slow["on"] = len(fast) >= 30
            if len(slowed) >= 20:
                break
    assert emitted == plain[: len(emitted)]  # only the choice of what to propose changed, never the verification
    assert all(ev.stats.paused is None for ev in fast[-10:])  # speculating (bar a plain step that measures)
    paused_at = next(i for i, ev in enumerate(slowed) if ev.stats.paused is not None)
    assert paused_at <= 6  # plain within a few slowed steps
    assert all(ev.plan.size == 0 for ev in slowed[paused_at + 1 :])  # and it stays plain (probes are further apart)
