"""Stop strings on a stream of token texts (structured/stops.py), as the API and the window use them."""

from __future__ import annotations

import pytest

from localspec.config import ConfigError
from localspec.structured.stops import StopScan, check_stops, parse_stops
from localspec.ui.stopping import StoppedRecords


def test_the_box_splits_on_commas_and_lines():
    assert parse_stops("END, ###\n\nUser:  \n") == ("END", "###", "User:")
    assert parse_stops("  ") == ()
    with pytest.raises(ConfigError, match="at most 16"):
        check_stops(["x"] * 17)


def test_a_possible_start_of_a_stop_string_is_held_until_the_next_pieces_say():
    scan = StopScan(["</end>"])
    assert scan.add(["hello </"]) == ("hello ", range(0, 1))  # "</" may begin the stop string
    assert scan.add(["b> ok"]) == ("</b> ok", range(1, 2))  # it did not
    assert scan.add([" </e", "nd> more"]) == (" ", range(2, 3))
    assert scan.cut == len("hello </b> ok ") and scan.done
    assert scan.add(["after"]) == ("", range(3, 3))


def test_the_window_shows_whole_records_and_cuts_the_one_a_stop_string_begins_in():
    shown = StoppedRecords(["ee st"])
    texts = ["one", " ", "thre", "e", " ", "stop", " here"]
    first = shown.add([{"id": i, "text": t} for i, t in enumerate(texts[:3])])
    assert [r["text"] for r in first] == ["one", " "]  # "thre" ends in "e", which may begin "ee st"
    rest = shown.add([{"id": i, "text": t} for i, t in enumerate(texts[3:], start=3)])
    assert [r["text"] for r in rest] == ["thr"] and rest[0]["id"] == 2 and shown.stopped
    assert shown.add([{"id": 9, "text": "x"}], finished=True) == ()


def test_without_stop_strings_every_record_is_shown_at_once():
    shown = StoppedRecords(())
    records = [{"text": "a"}, {"text": ""}, {"text": "b"}]
    assert shown.add(records) == tuple(records) and not shown.stopped


def test_a_stop_string_lets_the_engine_go_for_the_next_answer(tiny_session):
    """The real engine: the answer ends at the stop string, and the next answer runs (the engine's lock was let go
    when the stream was closed)."""
    from localspec.ui.handlers import Handlers
    from localspec.ui.manager import ModelManager

    manager = ModelManager([tiny_session.loaded.spec], lambda _spec, _progress: tiny_session)
    manager.load(tiny_session.loaded.spec.name)
    handlers = Handlers(manager)
    settings = ("none", 3, 0.0, 1.0, 0, 24, 0, True, 0, False, "")

    def answer(stops: str) -> dict:
        *_, turns = list(handlers.send("Say something.", [], *settings, 1.0, stops))[-1]
        return turns[-1]

    whole = answer("")
    stop = whole["content"][5:8]  # greedy says the same again: it ends where this first occurs
    cut = answer(stop)
    assert cut["finish_reason"] == "stop" and cut["content"] == whole["content"][: whole["content"].index(stop)]
    assert answer("")["content"] == whole["content"]  # the engine answers again, in full
