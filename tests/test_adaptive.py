"""The adaptive controller's decisions on synthetic costs and acceptances (pure Python), and its greedy output."""

from __future__ import annotations

import copy
import random
from dataclasses import asdict

import pytest

from localspec.config import SpecConfig
from localspec.engine.adaptive import AdaptiveController, CostModel, VerifyCosts
from localspec.runtime.speedup import expected_tokens, predicted_speedups

PLAIN_S = 0.033  # a plain step: 1-token forward + sampling


def verify_seconds(tokens: int, slope: float) -> float:
    return PLAIN_S * (1 + slope * (tokens - 1))


def step(
    controller: AdaptiveController,
    rng: random.Random,
    acceptance: list[float],
    slope: float,
    draft_c: float = 0.0,
    available: float = 1.0,
) -> tuple[int, int, float]:
    """One simulated step in a world with the given true costs and per-position acceptance.
    available: probability the proposer finds any draft at all (an n-gram miss drafts nothing).
    Returns (tokens emitted, K asked, seconds)."""
    asked = controller.choose_k()
    drafted = asked if rng.random() < available else 0
    accepted = 0
    while accepted < drafted and rng.random() < acceptance[min(accepted, len(acceptance) - 1)]:
        accepted += 1
    propose_s = asked * draft_c * PLAIN_S
    verify_s = verify_seconds(drafted + 1, slope)
    controller.observe(asked, drafted, accepted, propose_s, verify_s)
    return accepted + 1, asked, propose_s + verify_s


def throughput_fixed(k: int, acceptance: list[float], slope: float, draft_c: float = 0.0) -> float:
    """Exact tokens per second of a fixed K in the synthetic world (K = 0: plain decoding)."""
    tokens = expected_tokens(acceptance + [acceptance[-1]] * 16, k)
    return tokens / (k * draft_c * PLAIN_S + verify_seconds(k + 1, slope))


def run_world(acceptance, slope, draft_c=0.0, steps=600, max_k=8, seed=0, available=1.0):
    rng = random.Random(seed)
    controller = AdaptiveController(max_k)
    tokens = seconds = 0.0
    ks = []
    for _ in range(steps):
        emitted, asked, spent = step(controller, rng, acceptance, slope, draft_c, available)
        tokens += emitted
        seconds += spent
        ks.append(asked)
    return tokens / seconds, ks, controller


def test_expected_tokens_matches_closed_form_for_constant_acceptance():
    for alpha in (0.2, 0.5, 0.8):
        for k in range(0, 7):
            closed = (1 - alpha ** (k + 1)) / (1 - alpha)
            assert expected_tokens([alpha] * 8, k) == pytest.approx(closed)


def test_expected_tokens_uses_per_position_rates():
    # position 1 always accepted, position 2 never: E(1) = 2, E(K ≥ 2) = 2
    assert expected_tokens([1.0, 0.0, 1.0], 1) == pytest.approx(2.0)
    assert expected_tokens([1.0, 0.0, 1.0], 3) == pytest.approx(2.0)
    assert predicted_speedups([1.0, 0.0], 0.0, [1.0, 1.2, 1.4]) == pytest.approx([1.0, 2 / 1.2, 2 / 1.4])


def test_cost_model_measures_c_and_v():
    costs = CostModel()
    costs.verify.set_prior(PLAIN_S, verify_seconds(5, 0.25), 5)  # the load-time timing agrees with the steps
    for tokens in (1, 3, 5):
        for _ in range(4):
            costs.observe(tokens - 1, tokens - 1, 0.1 * PLAIN_S * (tokens - 1), verify_seconds(tokens, 0.25))
    draft_c, verify = costs.ratios(6)
    assert draft_c == pytest.approx(0.1)
    assert verify[0] == pytest.approx(1.0)
    assert verify[4] == pytest.approx(2.0)  # measured: 5 tokens
    assert verify[6] == pytest.approx(2.5)  # 7 tokens, never measured: from the fitted line


def test_sizes_no_longer_picked_fade_and_the_timed_prior_holds_the_slope():
    """Rows are nearly free on this machine (timed at load). Early in a session K = 2…4 were measured in a slow
    stretch (1.4× their true time); since then only K = 1 runs. The old, slow medians fade, so the line comes back
    to the flat shape and longer drafts look as cheap as they are (otherwise K = 1 would be locked in)."""
    costs = CostModel()
    costs.verify.set_prior(PLAIN_S, verify_seconds(5, 0.01), 5)
    for _ in range(10):
        costs.observe(0, 0, 0.0, verify_seconds(1, 0.01))
    for _ in range(5):
        for rows in (3, 4, 5):
            costs.observe(rows - 1, rows - 1, 0.0, 1.4 * verify_seconds(rows, 0.01))
    slow = costs.ratios(4)[1][4]
    for _ in range(150):
        costs.observe(1, 1, 0.0, verify_seconds(2, 0.01))
    assert slow > 1.1  # while the slow samples are recent, they count
    assert costs.ratios(4)[1][4] < 1.12  # true 1.04; the slow samples' line says 1.4 (kept at full weight: 1.74)


def test_noisy_medians_at_nearby_sizes_do_not_tilt_a_timed_flat_line():
    costs = CostModel()
    costs.verify.set_prior(PLAIN_S, verify_seconds(5, 0.0), 5)
    rng = random.Random(0)
    for _ in range(30):
        rows = rng.choice((2, 3))
        costs.observe(rows - 1, rows - 1, 0.0, verify_seconds(rows, 0.0) * rng.uniform(0.85, 1.15))
    assert costs.ratios(8)[1][8] < 1.15  # a plain fit through two noisy neighbours can say far more


def test_high_acceptance_and_cheap_verify_picks_a_long_draft():
    _, ks, controller = run_world([0.9] * 8, slope=0.05)
    assert (
        sum(k == 0 for k in ks[100:]) <= len(ks[100:]) / 70
    )  # only the plain steps that measure what a plain step costs
    assert sum(ks[100:]) / len(ks[100:]) >= 5
    assert controller.best()[1] > 2.0


def probe_cost_share(ks: list[int], slope: float, draft_c: float = 0.0) -> float:
    """Extra time the probes cost (if none was accepted), as a share of the plain-decoding time."""
    return sum(k * draft_c + slope * k for k in ks if k > 0) / len(ks)


def test_low_acceptance_switches_speculation_off_and_probes_within_budget():
    shares, off = [], 0
    for seed in range(5):  # a lucky streak of accepted probes turns it on for a while: judge the typical run
        _, ks, controller = run_world([0.1] * 8, slope=0.15, seed=seed)
        tail = ks[200:]
        probes = [k for k in tail if k > 0]
        off += not controller.speculating
        assert len(probes) >= 20  # a cheap n-gram probe comes every few steps…
        assert max(probes) <= 2
        shares.append(probe_cost_share(tail, 0.15))
    assert off >= 4
    assert sorted(shares)[2] <= 0.03  # …and costs at most ~2% of the time


def test_first_position_only_picks_k_1():
    # typical of a chat n-gram: the next token sometimes, never a long run
    _, ks, _ = run_world([0.7, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05], slope=0.12)
    tail = ks[100:]
    assert max(set(tail), key=tail.count) == 1


def test_expensive_draft_model_turns_off():
    # a draft costing 60% of a target step with modest acceptance never pays
    _, ks, controller = run_world([0.5] * 8, slope=0.1, draft_c=0.6)
    assert not controller.speculating
    assert 0 < sum(k > 0 for k in ks[200:]) <= 400 / 30  # a costly probe is rare
    assert probe_cost_share(ks[200:], 0.1, 0.6) <= 0.03


def test_turns_back_on_when_the_text_becomes_predictable():
    rng = random.Random(1)
    controller = AdaptiveController(8)
    for _ in range(200):  # chat-like: speculation off
        step(controller, rng, [0.05] * 8, 0.15)
    assert not controller.speculating
    late = []
    for _ in range(300):  # code with repeated identifiers: probes find it and speculation resumes
        late.append(step(controller, rng, [0.9] * 8, 0.15)[1])
    assert controller.speculating
    assert sum(k == 0 for k in late[150:]) <= 150 / 70 + 1  # only the plain steps that measure a plain step


@pytest.mark.parametrize(
    "acceptance,slope,draft_c,available",
    [
        ([0.1] * 8, 0.12, 0.0, 1.0),  # chat with n-gram: off
        ([0.3] * 8, 0.12, 0.0, 0.5),  # n-gram that often finds nothing
        ([0.6, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5], 0.12, 0.0, 1.0),  # middling
        ([0.85] * 8, 0.12, 0.0, 1.0),  # code with n-gram
        ([0.75] * 8, 0.08, 0.15, 1.0),  # a draft model
        ([0.5] * 8, 0.4, 0.0, 1.0),  # verify almost as costly as K plain steps
    ],
)
def test_never_loses_to_plain_and_near_the_best_fixed_k(acceptance, slope, draft_c, available):
    adaptive, _, _ = run_world(acceptance, slope, draft_c, steps=2000, available=available)
    effective = [a * available if i == 0 else a for i, a in enumerate(acceptance)]
    plain = throughput_fixed(0, effective, slope, draft_c)
    best_fixed = max(throughput_fixed(k, effective, slope, draft_c) for k in range(0, 9))
    assert adaptive >= 0.95 * plain
    assert adaptive >= 0.90 * best_fixed


def test_adaptive_greedy_output_matches_plain_decoding(tiny_models):
    from localspec.config import SamplingParams, SpecConfig
    from localspec.engine.loop import Engine
    from localspec.proposers import DraftModelProposer, NgramProposer

    target, draft = tiny_models
    engine = Engine(target, stop_token_ids={2})
    sampling = SamplingParams(max_new_tokens=48)
    prompts = [[1, 72, 101, 108, 108, 111, 32, 119, 111], [1, 100, 101, 102, 32, 102, 40, 41, 58, 10]]
    for prompt in prompts:
        plain = [t.token_id for ev in engine.generate(prompt, sampling, SpecConfig(proposer="none")) for t in ev.tokens]
        for name, proposer in (("ngram", NgramProposer(1, 3)), ("draft", DraftModelProposer(draft))):
            events = list(engine.generate(prompt, sampling, SpecConfig(proposer=name, k=6, adaptive=True), proposer))
            ids = [t.token_id for ev in events for t in ev.tokens]
            assert ids == plain, name
            assert all(ev.stats.k <= 6 for ev in events)
            assert events[-1].stats.predicted_speedup is not None


def test_a_preempted_step_does_not_move_the_cost_estimate():
    costs = CostModel()
    for _ in range(10):
        costs.observe(0, 0, 0.0, PLAIN_S)
        costs.observe(4, 4, 0.0, verify_seconds(5, 0.15))
    usual = copy.deepcopy(costs)
    usual.observe(4, 4, 0.0, verify_seconds(5, 0.15))
    costs.observe(4, 4, 0.0, 20 * verify_seconds(5, 0.15))  # another process held the core for a while
    assert costs.ratios(4)[1][4] == pytest.approx(usual.ratios(4)[1][4])  # as if the step had taken its usual time


def test_a_new_answer_keeps_the_costs_and_a_faint_memory_of_acceptance():
    rng = random.Random(2)
    controller = AdaptiveController(4)
    for _ in range(100):
        step(controller, rng, [0.02] * 4, 0.2)
    assert not controller.speculating
    plain_before = controller.costs.verify_time(1)
    controller.begin()
    assert controller.costs.verify_time(1) == plain_before
    assert controller.choose_k() == 0  # the last answer's poor acceptance still speaks: no wasted first steps
    assert sum(controller.reached) == 0 and controller.acceptance()[0] < 0.2


def test_fixed_k_runs_get_the_break_even_prediction_too(tiny_models):
    from localspec.config import SamplingParams, SpecConfig
    from localspec.engine.loop import Engine
    from localspec.proposers import NgramProposer

    target, _ = tiny_models
    engine = Engine(target, stop_token_ids={2})
    sampling = SamplingParams(max_new_tokens=24)
    prompt = [1, 97, 98, 97, 98, 97, 98]
    plain = list(engine.generate(prompt, sampling, SpecConfig(proposer="none")))
    assert plain[-1].stats.predicted_speedup is None
    fixed = list(engine.generate(prompt, sampling, SpecConfig(proposer="ngram", k=3), NgramProposer(1, 3)))
    assert all(ev.stats.predicted_speedup is not None and ev.stats.predicted_speedup > 0 for ev in fixed)
    assert all(ev.stats.k == min(3, 24 - sum(len(e.tokens) for e in fixed[:i]) - 1) for i, ev in enumerate(fixed))


def test_the_answers_forecast_weights_each_steps_forecast_by_its_tokens_with_the_prefill(tiny_models):
    import math

    from localspec.config import SamplingParams, SpecConfig
    from localspec.engine.loop import Engine
    from localspec.engine.metrics import StatsSnapshot
    from localspec.proposers import NgramProposer

    # 10 tokens in steps forecast as 5 plain steps, a 0.1 s prefill, 0.01 s plain steps: (0.1 + 0.1) / (0.1 + 0.05)
    stats = StatsSnapshot(emitted=10, prefill_s=0.1, plain_step_s=0.01, forecast_plain_steps=5.0)
    assert (
        math.isclose(stats.answer_forecast, 0.2 / 0.15) and stats.to_dict()["answer_forecast"] == stats.answer_forecast
    )
    assert StatsSnapshot(emitted=10, forecast_plain_steps=5.0).answer_forecast is None  # no plain step measured
    target, _ = tiny_models
    engine = Engine(target, stop_token_ids={2})
    prompt = [1, 97, 98, 97, 98, 97, 98]
    events = list(engine.generate(prompt, SamplingParams(max_new_tokens=24), SpecConfig(proposer="ngram", k=3),
                                  NgramProposer(1, 3)))  # fmt: skip
    expected = 0.0  # each step: its tokens over its forecast after it, a step that drafted nothing at 1
    for event in events:
        drafted = event.propose_token_num > 0 and event.stats.predicted_speedup is not None
        expected += len(event.tokens) / (event.stats.predicted_speedup if drafted else 1.0)
    last = events[-1].stats
    assert math.isclose(last.forecast_plain_steps, expected) and last.emitted == sum(len(e.tokens) for e in events)
    plain = list(engine.generate(prompt, SamplingParams(max_new_tokens=24), SpecConfig(proposer="none")))
    assert plain[-1].stats.forecast_plain_steps == plain[-1].stats.emitted  # no forecast: every step plain


def test_a_new_answer_with_predictable_text_is_probed_within_a_few_steps():
    rng = random.Random(3)
    controller = AdaptiveController(4)
    for _ in range(300):  # a long chat answer: off
        step(controller, rng, [0.02] * 4, 0.2)
    controller.begin()  # the next answer is code
    ks = [step(controller, rng, [0.95] * 4, 0.2)[1] for _ in range(30)]
    assert 0 < ks.index(next(k for k in ks if k > 0)) <= 10
    assert controller.speculating and all(k > 0 for k in ks[15:])


def test_a_step_the_token_budget_keeps_from_drafting_keeps_the_last_prediction(tiny_models):
    """A length-capped answer ends with a step that may emit one token only (K = 0 by necessity). The predicted
    speedup shown at the end is the last real prediction, not that step's 1.00×."""
    from localspec.config import SamplingParams, SpecConfig
    from localspec.engine.loop import Engine
    from localspec.proposers import DraftModelProposer

    target, _ = tiny_models
    engine = Engine(target)
    sampling = SamplingParams(max_new_tokens=21)
    # the target drafting for itself: every draft is accepted, so steps emit 4, 4, 4, 4, 4 and then the budget's 1
    events = list(
        engine.generate(
            [1, 72, 101, 108, 108, 111], sampling, SpecConfig(proposer="draft", k=3), DraftModelProposer(target)
        )
    )
    assert [ev.propose_token_num for ev in events] == [3, 3, 3, 3, 3, 0]
    assert [ev.stats.k for ev in events] == [3, 3, 3, 3, 3, 0]
    assert events[-2].stats.predicted_speedup is not None
    assert events[-1].stats.predicted_speedup == events[-2].stats.predicted_speedup != 1.0


def test_a_paused_controller_explains_itself_in_its_own_numbers():
    _, _, controller = run_world([0.5] * 8, slope=0.1, draft_c=0.6)
    assert not controller.speculating
    reason = controller.pause_reason()
    k, speedup = controller.best()
    draft_c, verify = controller.costs.ratios(controller.max_k)
    assert reason.k == k and reason.speedup == pytest.approx(speedup) and speedup < 1.0
    assert reason.cost == pytest.approx(k * draft_c + verify[k]) and reason.cost > 1.0
    assert reason.tokens == pytest.approx(expected_tokens(controller.acceptance(), k))
    assert reason.tokens / reason.cost == pytest.approx(speedup)
    assert reason.probe_every == controller.probe_every(k)
    _, _, speculating = run_world([0.9] * 8, slope=0.05)
    assert speculating.speculating and speculating.pause_reason() is None


def test_the_engine_reports_the_pause_in_its_stats(tiny_models):
    from localspec.config import SamplingParams, SpecConfig
    from localspec.engine.loop import Engine
    from localspec.proposers import NgramProposer

    target, _ = tiny_models
    engine = Engine(target, stop_token_ids=set())
    spec = SpecConfig(proposer="ngram", k=3, adaptive=True)
    controller = AdaptiveController(3)
    controller.speculating = False  # as after answers that lost
    controller.costs.observe(3, 3, 0.3, 0.2)  # drafting costs 3 plain steps' worth: it stays off
    controller.costs.observe(0, 0, 0.0, 0.05)
    engine.controllers.chain[("ngram", 3, True)] = controller
    events = list(engine.generate([1, 5, 6, 7, 8], SamplingParams(max_new_tokens=6), spec, NgramProposer(1, 3)))
    paused = [ev.stats.paused for ev in events if ev.tokens]
    assert paused and all(p is not None and p.speedup < 1.0 for p in paused)
    assert events[-1].stats.to_dict()["paused"] == asdict(paused[-1])
    fixed = list(
        engine.generate(
            [1, 5, 6], SamplingParams(max_new_tokens=4), SpecConfig(proposer="ngram", k=3), NgramProposer(1, 3)
        )
    )
    assert all(ev.stats.paused is None for ev in fixed)  # fixed K never pauses


def test_the_verify_prior_comes_from_the_forwards_timed_on_this_machine():
    """Before two sizes are measured, v(K) follows the slope of a 1-token vs (K+1)-token forward timed at load."""
    flat, steep = VerifyCosts(), VerifyCosts()
    flat.set_prior(0.050, 0.052, 5)  # bf16 on a CPU with native bf16: 5 rows cost about what 1 does
    steep.set_prior(0.030, 0.060, 5)  # 5 rows cost twice 1
    assert flat.prior_slope == pytest.approx(0.01) and steep.prior_slope == pytest.approx(0.25)
    assert CostModel(flat).ratios(4)[1] == pytest.approx([1.0, 1.01, 1.02, 1.03, 1.04])
    picks = {}
    for name, costs in (("flat", flat), ("steep", steep)):
        controller = AdaptiveController(8, CostModel(costs), prior_acceptance=0.6)
        controller.observe(2, 2, 1, 0.0, 0.05)  # one size measured: the prior shape scales it
        picks[name] = controller.best()[0]
    assert picks["flat"] > picks["steep"]


def test_verify_costs_follow_the_line_through_every_measured_size():
    """A size measured early in an answer (a short cache) is not taken on its own: every size reads the fitted line,
    so a few cheap 1-row samples do not make every larger K look expensive."""
    costs = CostModel()
    for _ in range(3):
        costs.observe(0, 0, 0.0, 0.040)  # 1 row, early: short cache
    for _ in range(15):
        costs.observe(4, 4, 0.0, 0.050)
        costs.observe(2, 2, 0.0, 0.049)
    _, verify = costs.ratios(4)
    assert verify[4] < 0.050 / 0.040  # the 1-row median alone would say 1.25
    line = costs.verify.line()
    assert costs.verify_time(1) == pytest.approx(line[0] + line[1])


def test_controllers_give_their_tuning_to_every_controller_and_the_verify_line():
    from localspec.config import SpecConfig
    from localspec.engine.adaptive import Tuning
    from localspec.engine.policy import Controllers, StepPolicy

    class Chains:  # a proposer of chains with no parts
        name, supports_tree = "ngram", True

        def part(self, context):
            return None

        def certain(self, context):
            return 0

    class Room:
        room, context = 8, []

    tuning = Tuning(forget=0.5, verify_prior_weight=3.0, guess_prior_weight=0.25)
    loaded = Controllers()
    assert loaded.verify.prior_weight == Tuning().guess_prior_weight  # nothing timed yet: the constant guess's weight
    loaded.verify.set_prior(PLAIN_S, verify_seconds(5, 0.2), 5)
    loaded.verify.add(5, 0.05)
    retuned = Controllers.retuned(loaded, tuning)
    assert retuned.verify.prior_slope == loaded.verify.prior_slope and not retuned.verify.by_rows  # timed, not learnt
    assert (loaded.verify.prior_weight, retuned.verify.prior_weight) == (Tuning().verify_prior_weight, 3.0)
    spec = SpecConfig(proposer="ngram", k=4, adaptive=True, tree_nodes=8)
    policy = StepPolicy(retuned, spec, Chains(), 4, target_supports_tree=True)
    policy.plan(Room())
    assert policy.tree is not None and policy.tree.tuning is tuning and policy.chain.tuning is tuning
    assert policy.chain.costs.verify is retuned.verify and loaded.verify.tuning == Tuning()


@pytest.mark.parametrize("adaptive, tree_nodes", [(False, 0), (False, 8), (True, 0), (True, 8)])
def test_the_plan_drafts_every_certain_token_except_on_a_plain_step_that_measures(adaptive, tree_nodes):
    from localspec.config import SpecConfig
    from localspec.engine.plan import PLAIN, StepPlan
    from localspec.engine.policy import Controllers, StepPolicy

    class Forced:  # a proposer sure of its next `sure` drafts (a grammar's forced tokens)
        name, supports_tree, sure = "grammar+ngram", True, 14

        def part(self, context):
            return None

        def certain(self, context):
            return self.sure

    class Room:
        room, context = 12, []

    spec = SpecConfig(proposer="ngram", k=2, adaptive=adaptive, tree_nodes=tree_nodes)
    policy = StepPolicy(Controllers(), spec, Forced(), 8, target_supports_tree=True)
    assert policy.plan(Room()) == StepPlan.chain(12)  # 14 certain, past K and N; 12 within the token budget
    Forced.sure = 1
    assert policy.plan(Room()).size >= 1
    if adaptive:  # a plain step taken to measure the plain step's cost stays plain
        decider = policy.tree or policy.chain
        decider.measuring_plain = True
        policy._chosen = lambda run: PLAIN
        assert policy.plan(Room()) == PLAIN


def test_the_remembered_costs_follow_every_sample_even_one_another_controller_took():
    """CostModel keeps plain_time / verify_ratio / ratios between samples (the controllers ask for them dozens of
    times a step); a verify sample by any controller sharing the verify record, a proposal sample, or a new prior
    gives the values a fresh model computes from the same record."""
    shared = VerifyCosts()
    one, other = CostModel(shared), CostModel(shared)
    one.observe(0, 0, 0.0, 0.010)
    one.observe(3, 3, 0.003, 0.016)

    def fresh(model: CostModel) -> CostModel:  # nothing remembered: computed from the same record
        copy = CostModel(model.verify)
        copy.propose_per_token_s = model.propose_per_token_s
        return copy

    def same(model: CostModel) -> None:
        reference = fresh(model)
        assert model.ratios(4) == reference.ratios(4)
        assert model.plain_time() == reference.plain_time()
        assert [model.verify_ratio(r) for r in range(1, 6)] == [reference.verify_ratio(r) for r in range(1, 6)]

    same(other)
    before = other.ratios(4)
    one.observe_verify(4, 0.030)  # another controller's sample moves the shared line
    assert other.ratios(4) != before
    same(other)
    before = one.ratios(4)
    one.observe(2, 2, 0.008, 0.014)  # a proposal sample moves c
    assert one.ratios(4)[0] != before[0]
    same(one)
    before = one.plain_time()
    shared.set_prior(0.010, 0.030, 5)
    same(one)
    assert one.verify_ratio(5) == fresh(one).verify_ratio(5) and one.plain_time() is not None and before is not None


def test_while_off_the_options_are_evaluated_at_the_probes_alone(monkeypatch):
    _, _, controller = run_world([0.5] * 8, slope=0.1, draft_c=0.6)  # off: a costly draft that never pays
    assert not controller.speculating
    evaluated = []
    best = AdaptiveController.best
    monkeypatch.setattr(AdaptiveController, "best", lambda self: evaluated.append(len(ks)) or best(self))
    rng, ks = random.Random(1), []
    for _ in range(200):
        ks.append(step(controller, rng, [0.5] * 8, 0.1, 0.6)[1])
    probes = [i for i, k in enumerate(ks) if k > 0]
    assert len(probes) >= 3
    # only a probe's step evaluates (its choice, and what it found); the plain steps between probes rest: plain
    # decoding's cost, no forecast computed
    assert set(evaluated) <= set(probes) | {0}
    reason = controller.pause_reason()
    assert reason is not None and reason.speedup < 1.0


def test_the_remembered_speedups_follow_every_change_of_the_evidence():
    rng = random.Random(3)
    controller = AdaptiveController(6)
    for _ in range(300):
        asked = controller.choose_k()
        drafted = asked if rng.random() < 0.8 else 0
        accepted = sum(1 for _ in range(drafted) if rng.random() < 0.6)
        controller.observe(asked, drafted, accepted, asked * 0.002, verify_seconds(drafted + 1, 0.12))
        remembered = list(controller.speedups())
        controller._acceptance = controller._speedups = None  # computed afresh
        assert remembered == controller.speedups()


def test_a_load_time_draft_cost_is_the_prior_until_the_first_draft():
    from localspec.engine.policy import Controllers, StepPolicy
    from localspec.proposers.ngram import NgramProposer

    controllers = Controllers(propose_priors={"ngram": 0.02})
    spec = SpecConfig(proposer="ngram", k=4, adaptive=True)
    policy = StepPolicy(controllers, spec, NgramProposer(), 4, False)
    costs = policy._chain_controller(None).costs
    assert costs.propose_per_token_s.value == 0.02 and costs.propose_per_token_s.count == 1
    costs.verify.set_prior(PLAIN_S, verify_seconds(5, 0.1), 5)
    costs.observe_verify(1, PLAIN_S)
    draft_c, _ = costs.ratios(4)
    assert draft_c == pytest.approx(0.02 / PLAIN_S, rel=0.2)  # drafting is dear before anything was drafted
    costs.observe(4, 4, 4 * 0.0001, verify_seconds(5, 0.1))
    assert costs.propose_per_token_s.value == pytest.approx(0.0001)  # the first measured draft replaces the prior
    unprimed = StepPolicy(Controllers(), spec, NgramProposer(), 4, False)._chain_controller(None).costs
    assert unprimed.propose_per_token_s.count == 0


def test_the_load_time_timing_of_a_proposer_says_none_when_it_drafts_nothing():
    from localspec.proposers.ngram import NgramProposer
    from localspec.proposers.timing import seconds_per_token

    assert seconds_per_token(NgramProposer(2, 4), vocab_size=1_000_000) is None  # random ids: no n-gram repeats
    seconds = seconds_per_token(NgramProposer(1, 4), vocab_size=3)  # three ids: every suffix repeats
    assert seconds is not None and 0 < seconds < 0.1
