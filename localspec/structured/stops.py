"""Stop strings: where an answer's text ends, found as it streams (the API's `stop` and the window's "Stop strings").

The answer comes as pieces of text, one per token. A piece is released once no stop string can begin in it: the end
of the text that may be the start of a stop string is held back until the next pieces say. Once a stop string
appears, the text ends where it begins (the stop string itself is not part of the answer), and the pieces that begin
before that point are the answer's last ones (the last may run past it: the released text is cut, its token kept).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from localspec.config import ConfigError

MAX_STOPS = 16  # vLLM takes any number; Continue's autocomplete sends its template's stops plus three
MAX_STOP_CHARS = 200


def parse_stops(text: str) -> tuple[str, ...]:
    """The window's box → stop strings: one per line, or comma-separated on a line; blanks around each are dropped
    (a stop string that is a comma or starts with a blank is for the API)."""
    return tuple(part.strip() for line in text.splitlines() for part in line.split(",") if part.strip())


def check_stops(stops: Sequence[str], what: str = "stop") -> tuple[str, ...]:
    """The stop strings within the limits (the API's and the window's), else a ConfigError naming `what`."""
    if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise ConfigError(f"{what} takes at most {MAX_STOPS} strings of ≤ {MAX_STOP_CHARS} characters")
    return tuple(stops)


class StopScan:
    """One answer's text, watched for stop strings as its pieces come."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self.longest = max((len(s) for s in self.stops), default=0)
        self.text = ""
        self.offsets: list[int] = []  # each piece's offset in text
        self.sent = 0  # the text released so far ends here
        self.released = 0  # pieces released so far
        self.cut: Optional[int] = None  # where a stop string begins
        self.done = False

    def add(self, pieces: Sequence[str], finished: bool = False) -> tuple[str, range]:
        """Take the next pieces (finished: the answer ended after them). Returns the text released now and the
        indices of the pieces released now. After a stop string or the end nothing more is released."""
        if self.done:
            return "", range(self.released, self.released)
        for piece in pieces:
            self.offsets.append(len(self.text))
            self.text += piece
        if self.stops:
            start = max(0, self.sent - self.longest)  # what lies before was searched already
            found = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
            if found:
                self.cut, self.done = min(found), True
        self.done = self.done or finished
        if self.cut is not None:
            upto = self.cut
        elif self.done:
            upto = len(self.text)
        else:
            upto = len(self.text) - self.held()
        released, self.sent = self.text[self.sent : upto], max(self.sent, upto)
        first = self.released
        while self.released < len(self.offsets) and (
            self.offsets[self.released] < upto or (self.done and self.cut is None)
        ):
            self.released += 1
        return released, range(first, self.released)

    def held(self) -> int:
        """Length of the longest end of the text that may be the start of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best
