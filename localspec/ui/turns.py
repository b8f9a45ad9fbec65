"""The turns of a conversation, as the UI's handlers work with them.

gr.State holds each turn's plain dict form (to_state), which the renderers read and the browser's session keeps;
the handlers convert once on the way in (turns_from_state) and once on the way out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal, Optional, Union


@dataclass
class UserTurn:
    content: str
    role: Literal["user", "system"] = "user"

    def to_state(self) -> dict:
        return {"role": self.role, "content": self.content}


@dataclass
class AssistantTurn:
    """One answer: its text, its token records (TokenEvent.to_dict() plus text) and how it ran."""

    content: str = ""
    tokens: list[dict] = field(default_factory=list)
    streaming: bool = False  # the state form marks it with "pending": True
    stats: Optional[dict] = None  # StatsSnapshot.to_dict() of the latest step
    finish_reason: Optional[str] = None  # the engine's, or 'incomplete' for an answer the app never finished
    error: Optional[str] = None
    model: Optional[str] = None
    proposer: Optional[str] = None
    k: Optional[int] = None
    tree_nodes: Optional[int] = None  # the size of the token trees it drafted; 0 or None: chains of K
    sampling: Optional[dict] = None  # settings_dict of the SamplingParams it ran with
    system: Optional[str] = None  # the system prompt it was given ("" or None: none), for Compare to repeat
    label: str = ""
    notice: Optional[str] = None

    @property
    def role(self) -> Literal["assistant"]:
        return "assistant"

    def to_state(self) -> dict:
        data = {"role": "assistant", **asdict(self)}
        if data.pop("streaming"):
            data["pending"] = True
        return data

    def events_json(self) -> dict:
        """What the events panel shows of this answer."""
        return {
            "model": self.model,
            "proposer": self.proposer,
            "k": self.k,
            "tree_nodes": self.tree_nodes,
            "finish_reason": self.finish_reason,
            "error": self.error,
            "stats": self.stats,
            "tokens": self.tokens,
        }


Turn = Union[UserTurn, AssistantTurn]
_ASSISTANT_KEYS = tuple(name for name in AssistantTurn.__dataclass_fields__ if name != "streaming")


def turn_from_state(data: dict) -> Turn:
    if data.get("role") != "assistant":
        return UserTurn(str(data.get("content", "")), "system" if data.get("role") == "system" else "user")
    values = {name: data[name] for name in _ASSISTANT_KEYS if data.get(name) is not None}
    return AssistantTurn(**values, streaming=bool(data.get("pending")))


def turns_from_state(turns: Optional[list[dict]]) -> list[Turn]:
    return [turn_from_state(turn) for turn in turns or []]


def turns_to_state(turns: list[Turn]) -> list[dict]:
    return [turn.to_state() for turn in turns]
