"""The progress bar of a model pair that loads or is switched (localspec/ui/loadbar.py, Handlers.switch)."""

from __future__ import annotations

import re

from localspec.config import ModelSpec, PairSpec
from localspec.ui.handlers import Handlers
from localspec.ui.loadbar import LoadProgress, expected_stages
from localspec.ui.manager import ModelManager


def bar_values(html: str) -> tuple[int, int]:
    match = re.search(r'<progress class="ls-load" max="(\d+)" value="(\d+)"', html)
    assert match, html
    return int(match.group(2)), int(match.group(1))


def test_load_stages_follow_the_pair(tmp_path):
    plain = PairSpec(name="p", target=ModelSpec(source=str(tmp_path)))
    assert expected_stages(plain) == 2  # the target, "Ready."
    with_draft = PairSpec(name="d", target=ModelSpec(source=str(tmp_path)), draft=ModelSpec(source=str(tmp_path)))
    assert expected_stages(with_draft) == 3
    assert LoadProgress("nope", [plain]).total == 1


def test_switching_shows_a_progress_bar_for_each_load_stage(tmp_path):
    from localspec.ui.echo import EchoSession

    pairs = [
        PairSpec(name="a", target=ModelSpec(source="echo")),
        PairSpec(name="b", target=ModelSpec(source=str(tmp_path)), draft=ModelSpec(source=str(tmp_path))),
    ]

    def factory(pair, progress):
        if pair.name == "b":
            for message in ("Loading target b…", "Loading draft b…", "Ready."):
                progress(message)
        return EchoSession()

    manager = ModelManager(pairs, factory)
    manager.load("a")
    statuses = [out[0] for out in Handlers(manager).switch("b")]
    bars = [bar_values(s) for s in statuses[:-1]]
    assert bars == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert "Loading draft b…" in statuses[2] and "stage 2 of 3" in statuses[2]
    assert "Loaded b in" in statuses[-1] and "<progress" not in statuses[-1]
