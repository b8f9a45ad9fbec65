"""`localspec bench --background-load N`: busy processes beside the bench that end with it, however it ends."""

from __future__ import annotations

import os
import time

import pytest

from localspec.bench.load import background_load, check_load
from localspec.config import ConfigError


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie not yet reaped is gone too
        return stat.read().split(") ")[1][0] != "Z"


def test_the_load_runs_during_the_block_and_stops_when_it_ends_or_fails():
    with background_load(2) as pids:
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
    assert not any(alive(pid) for pid in pids)
    with pytest.raises(RuntimeError):
        with background_load(1) as failed:
            raise RuntimeError("the bench failed")
    assert not alive(failed[0])


def test_a_load_process_ends_by_itself_at_its_bound():
    with background_load(1, max_s=0.3) as pids:
        time.sleep(1.5)
        assert not alive(pids[0])


def test_the_load_is_bounded_by_the_cpus():
    check_load(0)
    for bad in (-1, (os.cpu_count() or 1) + 1):
        with pytest.raises(ConfigError, match="background-load"):
            check_load(bad)


def test_the_bench_checks_each_answers_forecast_against_its_measured_speedup():
    from types import SimpleNamespace

    from localspec.bench.forecast import forecast_check, to_markdown
    from localspec.engine.metrics import StatsSnapshot

    def result(tokens: int, seconds: float, forecast=None):
        # an answer's forecast: its tokens over its steps' forecast in plain steps (no prefill here)
        stats = StatsSnapshot(
            emitted=tokens, plain_step_s=0.01, forecast_plain_steps=tokens / forecast if forecast else 0
        )
        return SimpleNamespace(token_ids=[0] * tokens, seconds=seconds, stats=stats)

    modes = [SimpleNamespace(name="none", label="none"), SimpleNamespace(name="ngram", label="ngram K=4")]
    records = [  # measured speedups 2.0, 1.0 and 1.25; forecasts 2.0, 2.0 and 1.0; a short answer is left out
        SimpleNamespace(results={"none": result(100, 2.0), "ngram K=4": result(100, 1.0, 2.0)}),
        SimpleNamespace(results={"none": result(100, 2.0), "ngram K=4": result(100, 2.0, 2.0)}),
        SimpleNamespace(results={"none": result(100, 2.0), "ngram K=4": result(100, 1.6, 1.0)}),
        SimpleNamespace(results={"none": result(10, 1.0), "ngram K=4": result(10, 0.1, 9.0)}),
    ]
    check = forecast_check(records, modes)
    assert set(check) == {"ngram K=4"}
    spread = check["ngram K=4"]
    assert spread["answers"] == 3 and spread["median"] == 1.0 and spread["within"] == 2 / 3
    assert "| ngram K=4 | 3 | 1.00 | 0.80 | 2.00 | 67% |" in to_markdown(check)
