"""Versions of a message in the window: an edited message or a regenerated answer is a new version, and the turns
after the old one stay with it, reachable by switching that message's version back (‹ 1/2 ›).

The window's state stays the shown path (a list of turn dicts, as every handler reads it); a turn with other
versions carries them under VERSIONS: {"before": [...], "after": [...]}, each a branch, the list of turns that is shown
from that place on when that version is (its own later versions nested inside it). The store keeps the same tree
(store/db.py: every version a sibling, the path below a version the one last shown there), so a reopened conversation
comes back as it was left.
"""

from __future__ import annotations

from typing import Optional

VERSIONS = "versions"


def _bare(turn: dict) -> dict:
    return {key: value for key, value in turn.items() if key != VERSIONS}


def _others(turn: dict) -> tuple[list, list]:
    versions = turn.get(VERSIONS) or {}
    return list(versions.get("before") or []), list(versions.get("after") or [])


def _with(branch: list[dict], before: list, after: list) -> list[dict]:
    """The branch shown, its first turn holding the other versions of its place."""
    first = _bare(branch[0])
    if before or after:
        first[VERSIONS] = {"before": before, "after": after}
    return [first, *branch[1:]]


def version_of(turn: dict) -> tuple[int, int]:
    """(which version the turn is, of how many), from 1."""
    before, after = _others(turn)
    return len(before) + 1, len(before) + 1 + len(after)


def branch(turns: list[dict], at: int, new: list[dict]) -> list[dict]:
    """The turns with `new` shown from index `at` on as the newest version of that place; what was shown there is
    kept as a version (at past the end: `new` is appended)."""
    if at >= len(turns):
        return [*turns, *new]
    before, after = _others(turns[at])
    old = [_bare(turns[at]), *turns[at + 1 :]]
    return [*turns[:at], *_with(new, [*before, old, *after], [])]


def switch(turns: list[dict], at: int, step: int) -> Optional[list[dict]]:
    """The turns with the version `step` away (−1: the one before) shown at index `at`, or None when there is none."""
    if not 0 <= at < len(turns) or step == 0:
        return None
    before, after = _others(turns[at])
    versions = [*before, None, *after]  # None: the branch shown now
    target = len(before) + step
    if not 0 <= target < len(versions):
        return None
    versions[len(before)] = [_bare(turns[at]), *turns[at + 1 :]]
    chosen = versions[target]
    return [*turns[:at], *_with(chosen, versions[:target], versions[target + 1 :])]


def from_tree(conversation, turn_of) -> list[dict]:
    """A stored Conversation's shown path as the window's turns, every other version nested where it belongs.
    turn_of: a stored Message → its turn dict."""

    def path(messages) -> list[dict]:
        turns = []
        for message in messages:
            versions = conversation.versions_of(message)
            turn = turn_of(message)
            if len(versions) > 1:
                index = [m.id for m in versions].index(message.id)
                turn[VERSIONS] = {
                    "before": [below(m) for m in versions[:index]],
                    "after": [below(m) for m in versions[index + 1 :]],
                }
            turns.append(turn)
        return turns

    def below(message) -> list[dict]:
        first, *rest = conversation.path_from(message)
        return [turn_of(first), *path(rest)]

    return path(conversation.messages)
