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
