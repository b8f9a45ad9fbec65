"""The measured figures are data: the guarantee's rows and the exact setup's dummy rows load from assets/rounding/
(localspec/measured.py), every path and setup the code can select has a measurement, and what is loaded is what the
measurement files say."""

import json
import typing

import pytest
import torch

from localspec import measured
from localspec.bench.rounding import PATHS
from localspec.measured import ROUNDING, MeasurementError, exact_rows, rounding_rows
from localspec.runtime.plan import EXACT_ROWS, EXACT_ROWS_DEFAULT
from localspec.verify.guarantee import MEASURED, MEASURED_BY_CPU, CpuFamily, Setup, measurement


def selectable(quant: str) -> list[str]:
    """The setups guarantee.setup_name can return for a target of this quant: exact-kernels needs every decoder linear
    on the q4 kernel (row_invariant_layers), which only a GGUF's int4 linears are."""
    return [setup for setup in typing.get_args(Setup) if setup != "exact-kernels" or quant == "gguf"]


@pytest.mark.parametrize("family", typing.get_args(CpuFamily))
def test_every_cpu_path_and_setup_the_code_can_select_has_a_measurement(family):
    missing = [
        (dtype, quant, setup)
        for dtype, quant in PATHS.values()
        for setup in selectable(quant)
        if measurement("cpu", dtype, quant, setup, family)[0] is None
    ]
    assert not missing, f"no measurement states these on {family}: {missing} (add them to assets/rounding/index.json)"


def _file_totals(reference: str) -> dict:
    name, _, setup = reference.rpartition(":")
    return json.loads((ROUNDING / name).read_text(encoding="utf-8"))["setups"][setup]


def test_the_loaded_figures_are_what_the_measurement_files_say():
    """Each row's chain and tree figures, pooled over its runs, against the totals each file wrote over chains and
    trees together (the file's own sums, not recomputed here from its row counts)."""
    index = json.loads(measured.INDEX.read_text(encoding="utf-8"))
    assert len(rounding_rows()) == len(index["rows"]) == len(MEASURED) + len(MEASURED_BY_CPU)
    for entry in index["rows"]:
        key = (entry["device"], entry["dtype"], entry["quant"], entry["setup"])
        loaded = MEASURED_BY_CPU[(*key, entry["family"])] if "family" in entry else MEASURED[key]
        totals = [_file_totals(reference) for reference in entry["runs"]]
        assert loaded.positions + loaded.tree_positions == sum(t["positions"] for t in totals), key
        assert loaded.unequal + loaded.tree_unequal == sum(t["unequal"] for t in totals), key
        assert max(loaded.max_abs_diff, loaded.tree_max_abs_diff) == max(t["max_abs_diff"] for t in totals), key
        assert max(loaded.max_flip_gap, loaded.tree_max_flip_gap) == max(t["max_flip_gap"] for t in totals), key
        machines = {index["machines"][reference.split("/")[0]] for reference in entry["runs"]}
        assert all(machine in loaded.measured_on for machine in machines), key


def test_the_exact_setups_dummy_rows_are_the_files():
    data = json.loads(measured.EXACT_ROWS_FILE.read_text(encoding="utf-8"))
    assert {str(dtype).replace("torch.", ""): rows for dtype, rows in EXACT_ROWS.items()} == {
        name: (entry["min_rows"], entry["row_multiple"]) for name, entry in data["dtypes"].items()
    }
    assert EXACT_ROWS_DEFAULT == (data["default"]["min_rows"], data["default"]["row_multiple"])
    assert set(EXACT_ROWS) == {torch.float32, torch.bfloat16, torch.float16}


@pytest.fixture
def fresh_cache():
    rounding_rows.cache_clear()
    exact_rows.cache_clear()
    yield
    rounding_rows.cache_clear()
    exact_rows.cache_clear()


def test_a_broken_measurement_file_is_named_in_the_error(tmp_path, monkeypatch, fresh_cache):
    index = tmp_path / "index.json"
    index.write_text('{"machines": {}, "rows": [{"device": "cpu", "dtype": "float32", "quant": "none", '
                     '"setup": "fast", "runs": ["epyc/float32.json:no-such-setup"]}]}')  # fmt: skip
    monkeypatch.setattr(measured, "INDEX", index)
    with pytest.raises(MeasurementError, match="float32.json has no setup 'no-such-setup'"):
        rounding_rows()
    rows = tmp_path / "exact_rows.json"
    rows.write_text('{"dtypes": {"float32": {"min_rows": 8}}, "default": {"min_rows": 4, "row_multiple": 4}}')
    monkeypatch.setattr(measured, "EXACT_ROWS_FILE", rows)
    with pytest.raises(MeasurementError, match="exact_rows.json"):
        exact_rows()
    index.write_text("{not json")
    with pytest.raises(MeasurementError, match="index.json"):
        rounding_rows()
