"""Measured figures the code reads at import instead of carrying them as constants: the rounding measurements behind
each compute path's guarantee (assets/rounding/index.json and the files it names, written by `localspec bench
rounding`) and the exact setup's dummy rows per compute dtype (assets/rounding/exact_rows.json).

A leaf module (json and the files only), so that runtime/ and verify/ both read it without importing each other.
A missing or malformed file raises MeasurementError naming the file: the figures are part of the program.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, fields
from pathlib import Path

ROUNDING = Path(__file__).resolve().parents[1] / "assets" / "rounding"
INDEX = ROUNDING / "index.json"
EXACT_ROWS_FILE = ROUNDING / "exact_rows.json"


class MeasurementError(RuntimeError):
    """A measurement file the code reads is missing or not in the shape it expects."""


@dataclass(frozen=True)
class Tally:
    """Rows of multi-row forwards against the same rows of 1-row forwards (one row count, or pooled)."""

    positions: int = 0
    unequal: int = 0  # positions whose logits were not bitwise equal to plain decoding's
    max_abs_diff: float = 0.0  # the largest |Δlogit|
    flips: int = 0  # positions whose argmax differed
    max_flip_gap: float = 0.0  # the largest top-2 gap (plain decoding's logits) among the flips; 0.0 with none

    def __add__(self, other: Tally) -> Tally:
        return Tally(
            self.positions + other.positions,
            self.unequal + other.unequal,
            max(self.max_abs_diff, other.max_abs_diff),
            self.flips + other.flips,
            max(self.max_flip_gap, other.max_flip_gap),
        )

    @classmethod
    def pooled(cls, tallies) -> Tally:
        return sum(tallies, cls())


@dataclass(frozen=True)
class Run:
    """One setup of one measurement file: its chains and trees pooled over their row counts."""

    file: str  # relative to assets/rounding/
    setup: str  # the setup's name inside the file (measure_rounding's names: fast, exact, engine, ...)
    chains: Tally
    trees: Tally
    cpu: str  # index.json's words for the folder's CPU, else the file's
    setting: str  # threads and versions (the file's machine) and the sample


@dataclass(frozen=True)
class Row:
    """One row of index.json: the measurement that states a path and setup (on one CPU family, or any)."""

    device: str
    dtype: str
    quant: str
    setup: str
    family: str | None  # None: any CPU family without a row of its own
    runs: tuple[Run, ...]

    @property
    def chains(self) -> Tally:
        return Tally.pooled(run.chains for run in self.runs)

    @property
    def trees(self) -> Tally:
        return Tally.pooled(run.trees for run in self.runs)

    @property
    def measured_on(self) -> str:
        cpus = " and ".join(dict.fromkeys(run.cpu for run in self.runs))
        return f"{cpus}, {' / '.join(dict.fromkeys(run.setting for run in self.runs))}"


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MeasurementError(f"cannot read the measurement {path}: {exc}") from exc


def _tally(counts: dict, path: Path) -> Tally:
    try:
        return Tally(**{f.name: counts[f.name] for f in fields(Tally)})
    except (KeyError, TypeError) as exc:
        raise MeasurementError(f"{path}: a row count's figures lack {exc}") from exc


def sample_words(data: dict) -> str:
    """The sample a rounding file measured, in words: prompts × tokens, row counts, trees."""
    chunks = data.get("chunks") or []
    rows = f", R = {min(chunks)}..{max(chunks)}" if chunks else ""
    trees = sorted({int(size) for setup in data.get("setups", {}).values() for size in setup.get("trees", {})})
    tree_words = f", trees of {' / '.join(map(str, trees))} rows" if trees else ""
    return f"{data.get('prompts', '?')} prompts no test reads × {data.get('new_tokens', '?')} tokens{rows}{tree_words}"


def read_run(reference: str, machines: dict[str, str]) -> Run:
    """'<file>:<setup>' under assets/rounding/ → its chains and trees, pooled."""
    name, _, setup = reference.rpartition(":")
    path = ROUNDING / name
    data = _read(path)
    found = data.get("setups", {}).get(setup)
    if found is None:
        raise MeasurementError(f"{path} has no setup {setup!r} (it has: {', '.join(data.get('setups', {}))})")
    chains = Tally.pooled(_tally(t, path) for t in found.get("chains", {}).values())
    trees = Tally.pooled(_tally(t, path) for t in found.get("trees", {}).values())
    cpu, _, rest = str(data.get("machine", "unknown machine")).partition(", ")
    setting = f"{rest}; {sample_words(data)}" if rest else sample_words(data)
    return Run(name, setup, chains, trees, machines.get(Path(name).parent.as_posix(), cpu), setting)


@functools.cache
def rounding_rows() -> tuple[Row, ...]:
    """index.json's rows with their runs' figures read from the files they name."""
    index = _read(INDEX)
    machines = index.get("machines", {})
    rows = []
    for entry in index.get("rows", []):
        try:
            key = (entry["device"], entry["dtype"], entry["quant"], entry["setup"])
            runs = tuple(read_run(reference, machines) for reference in entry["runs"])
        except KeyError as exc:
            raise MeasurementError(f"{INDEX}: a row lacks {exc}: {entry}") from exc
        rows.append(Row(*key, entry.get("family"), runs))
    return tuple(rows)


@functools.cache
def exact_rows() -> tuple[dict[str, tuple[int, int]], tuple[int, int]]:
    """({compute dtype name: (min_rows, row_multiple)}, the default for a dtype not listed) from exact_rows.json."""
    data = _read(EXACT_ROWS_FILE)
    try:
        pair = lambda entry: (int(entry["min_rows"]), int(entry["row_multiple"]))  # noqa: E731
        return {name: pair(entry) for name, entry in data["dtypes"].items()}, pair(data["default"])
    except (KeyError, TypeError, ValueError) as exc:
        raise MeasurementError(
            f"{EXACT_ROWS_FILE}: expected dtypes and default with min_rows, row_multiple ({exc})"
        ) from exc
