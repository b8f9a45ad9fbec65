"""The window's settings kept in the browser (ui/remembered.py): what comes back is checked group by group, and a bad
group is left at the controls' defaults without touching the others."""

from __future__ import annotations

from localspec.ui.remembered import NAMES, remember, restorable, restore

GOOD = dict(
    temperature=0.7,
    top_p=0.9,
    top_k=40,
    max_new_tokens=77,
    seed=5,
    repetition_penalty=1.1,
    stop_strings="HALT",
    colour=True,
    keep=False,
)


def test_kept_settings_come_back_whole():
    assert remember(*(GOOD[name] for name in NAMES)) == GOOD
    assert restorable(GOOD) == GOOD
    updates = restore(GOOD)
    assert [u["value"] for u in updates] == [GOOD[name] for name in NAMES]


def test_a_bad_group_is_left_out_and_the_rest_comes_back():
    bad_sampling = dict(GOOD, temperature="hot")
    assert restorable(bad_sampling) == {"stop_strings": "HALT", "colour": True, "keep": False}
    bad_rest = dict(GOOD, stop_strings=["not", "text"], colour="yes", keep=None, max_new_tokens=77.0)
    found = restorable(bad_rest)
    assert set(found) == {"temperature", "top_p", "top_k", "max_new_tokens", "seed", "repetition_penalty"}
    assert found["max_new_tokens"] == 77
    assert restorable(dict(GOOD, stop_strings="x\n" * 1000)).get("stop_strings") is None  # past the stop limits
    assert restorable(dict(GOOD, max_new_tokens=-3)).get("max_new_tokens") is None
    for junk in (None, [], "settings", 3):
        assert restorable(junk) == {}
        assert all(not isinstance(u, dict) or "value" not in u for u in restore(junk))  # every control as it is
