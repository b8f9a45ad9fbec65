"""The window's stop strings on an answer's token records (the text matching is structured/stops.py's, the API's).

A record is shown once its whole text is released: one whose text may begin a stop string waits for the next
tokens. Where a stop string appears the answer ends: the record it begins in keeps the text before it, and nothing
after is shown or saved.
"""

from __future__ import annotations

from collections.abc import Sequence

from localspec.structured.stops import StopScan


class StoppedRecords:
    def __init__(self, stops: Sequence[str]) -> None:
        self.scan = StopScan(stops)
        self.records: list[dict] = []
        self.shown = 0  # records released so far

    @property
    def stopped(self) -> bool:
        """A stop string ended the answer."""
        return self.scan.cut is not None

    def add(self, records: Sequence[dict], finished: bool = False) -> tuple[dict, ...]:
        """Take one event's records (finished: the answer ended after them); the records released now."""
        if self.scan.done:
            return ()
        self.records.extend(records)
        self.scan.add([record.get("text") or "" for record in records], finished)
        cut, limit = self.scan.cut, self.scan.sent
        out = []
        while self.shown < len(self.records):
            record, offset = self.records[self.shown], self.scan.offsets[self.shown]
            text = record.get("text") or ""
            if cut is not None and offset >= cut:
                break
            if offset + len(text) > limit:
                if cut is None:
                    break  # held: it may begin a stop string
                record = {**record, "text": text[: cut - offset]}
            out.append(record)
            self.shown += 1
        return tuple(out)
