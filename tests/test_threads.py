"""The forwards' thread count following the load (engine/threads.py): fewer threads while other processes keep
cores busy, only where the plan says every forward is the same bits at any count, and an answer's tokens unchanged
when the count changes between its forwards."""

from __future__ import annotations

import torch

from localspec.config import Environment
from localspec.engine.threads import ThreadGovernor, cpu_seconds


class Machine:
    """A fake /proc/stat and os.times(): each reading advances the wall clock by 1 s, in which this process used
    `mine` CPU seconds and the others `others[i]` cores (the i-th reading's)."""

    def __init__(self, others: list[float], mine: float = 1.8) -> None:
        self.others, self.mine, self.now, self.busy, self.spent, self.readings = others, mine, 0.0, 0.0, 0.0, 0

    def clock(self) -> float:
        return self.now

    def read(self) -> tuple[float, float]:
        others = self.others[min(self.readings, len(self.others) - 1)]
        self.readings += 1
        self.now += 1.0
        self.busy += self.mine + others
        self.spent += self.mine
        return self.busy, self.spent


def test_it_keeps_the_configured_count_on_an_idle_machine_and_lowers_it_to_the_free_cores():
    machine = Machine([0.0, 0.0, 1.0, 0.9, 0.4, 2.0])
    governor = ThreadGovernor(2, cores=2, read=machine.read, clock=machine.clock, interval_s=0.5)
    # the first reading only starts the count: no interval to measure yet
    assert [governor.threads() for _ in range(6)] == [2, 2, 1, 1, 2, 1]
    quad = Machine([0.0, 1.0, 2.6])
    four = ThreadGovernor(4, cores=4, read=quad.read, clock=quad.clock, interval_s=0.0)
    assert [four.threads() for _ in range(3)] == [4, 3, 1]
    idle = Machine([0.0, 0.0, 0.0])
    one = ThreadGovernor(1, cores=2, read=idle.read, clock=idle.clock, interval_s=0.0)
    assert [one.threads() for _ in range(3)] == [1, 1, 1]  # never above what the caller set


def test_it_reads_at_most_once_an_interval_and_keeps_the_count_without_proc_stat():
    machine = Machine([0.0, 1.0])
    now = [0.0]
    governor = ThreadGovernor(2, cores=2, read=machine.read, clock=lambda: now[0], interval_s=0.5)
    assert governor.threads() == 2 and machine.readings == 1
    now[0] = 0.2
    assert governor.threads() == 2 and machine.readings == 1  # within the interval: the count as it was
    now[0] = 1.0
    assert governor.threads() == 1 and machine.readings == 2
    blind = ThreadGovernor(2, cores=2, read=lambda: None, clock=lambda: now[0], interval_s=0.0)
    assert [blind.threads() for _ in range(3)] == [2, 2, 2]
    reading = cpu_seconds()  # Linux: the machine's busy seconds and this process's, both growing
    assert reading is None or (reading[0] > 0 and reading[1] > 0)


def test_the_plan_lets_the_count_follow_the_load_only_where_every_forward_runs_on_the_kernels(
    embedded_session, tiny_models
):
    from localspec.runtime.plan import plan_forward

    model = embedded_session.engine.target.model
    on = plan_forward(model, exact=True)
    assert on.on_layer_kernel and on.threads.value == "follow load"
    off = plan_forward(model, exact=True, env=Environment.read({"LOCALSPEC_THREADS_FOLLOW_LOAD": "off"}))
    assert off.threads.value == "fixed" and "LOCALSPEC_THREADS_FOLLOW_LOAD" in off.threads.reason
    dense = plan_forward(tiny_models[0], exact=True)  # torch's matmuls: a row may round by the thread count
    assert not dense.on_layer_kernel and dense.threads.value == "fixed" and "torch" in dense.threads.reason


def test_an_answer_whose_thread_count_changes_between_forwards_is_plain_decodings_bitwise(
    embedded_session, monkeypatch
):
    from localspec.config import SamplingParams

    session = embedded_session
    engine = session.engine
    assert engine.governor is not None  # the plan lets it follow the load
    messages = [{"role": "user", "content": "List the planets of the solar system, one per line."}]
    sampling = SamplingParams(temperature=0.0, max_new_tokens=48)
    ids, _ = session.prompt_ids(messages, sampling.max_new_tokens)
    before = torch.get_num_threads()
    counts = []
    set_threads = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: counts.append(n) or set_threads(n))

    def answer(proposer: str, others: list[float]) -> list[int]:
        # every reading a new interval: the count alternates between the configured one and 1
        machine = Machine(others)
        governor = ThreadGovernor(2, cores=2, read=machine.read, clock=machine.clock, interval_s=0.0)
        monkeypatch.setattr(engine, "governor", governor)
        spec = session.default_spec(proposer=proposer)
        events = list(session.stream_ids(ids, sampling, spec))
        assert torch.get_num_threads() == 2  # the caller's count again once the answer is done
        return [token.token_id for event in events for token in event.tokens]

    torch.set_num_threads(2)
    try:
        plain = answer("none", [0.0])
        assert 1 not in counts  # an idle machine: the caller's count throughout
        counts.clear()
        alternating = [0.0, 0.0] + [1.0, 0.0] * 100
        assert answer("none", alternating) == plain and 1 in counts
        counts.clear()
        assert answer(session.loaded.default_proposer, alternating) == plain and 1 in counts
    finally:
        set_threads(before)
