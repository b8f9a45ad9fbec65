"""The measurement tools: the interleaving helper (bench/interleave.py) and the parsing of `localspec bench kernels`
and `localspec bench rounding`."""

import argparse

import pytest

from localspec.bench.interleave import interleave, medians, ratio, table
from localspec.cli import bench, bench_kernels, bench_rounding
from localspec.config import ConfigError


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="localspec")
    bench.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def test_interleave_calls_each_candidate_in_turn_and_drops_the_warmup_rounds():
    order, now = [], [0.0]
    cost = {"a": 1.0, "b": 3.0}

    def call(name):
        def run():
            order.append(name)
            now[0] += cost[name] + len(order) / 1000  # a drifting machine: later calls cost a little more

        return run

    times = interleave({"a": call("a"), "b": call("b")}, repeats=3, warmup=2, clock=lambda: now[0])
    assert order == ["a", "b"] * 5
    assert [round(t, 3) for t in times["a"]] == [1.005, 1.007, 1.009]  # rounds 3..5: calls 5, 7, 9
    assert [round(t, 3) for t in times["b"]] == [3.006, 3.008, 3.01]
    assert {name: round(v, 3) for name, v in medians(times, scale=1.0).items()} == {"a": 1.007, "b": 3.008}
    with pytest.raises(ValueError, match="repeats"):
        interleave({"a": call("a")}, repeats=0)


def test_table_aligns_figures_right_and_refuses_a_ragged_row():
    assert table(["rows", "ms"], [[1, "0.50"], [2, "0.75"]]) == "| rows | ms |\n|---|---:|\n| 1 | 0.50 |\n| 2 | 0.75 |"
    with pytest.raises(ValueError, match="2 columns"):
        table(["rows", "ms"], [[1]])
    assert ratio(3.0, 2.0) == "1.50" and ratio(1.0, 0.0) == "–"


def test_bench_kernels_parses_its_options_and_bench_alone_still_runs_the_modes():
    args = parse("kernels", "--against", "HEAD~1", "--kernels", "q4", "attention", "--rows", "1", "9", "--cached", "64")
    assert args.bench_command == "kernels" and args.against == "HEAD~1"
    assert args.kernels == ["q4", "attention"] and args.rows == [1, 9] and args.cached == 64
    assert parse("--limit", "2").bench_command is None
    with pytest.raises(SystemExit):
        parse("kernels", "--rows", "0")
    with pytest.raises(ConfigError, match="unknown kernel gemm"):
        bench_kernels.run(parse("kernels", "--kernels", "gemm"))


def test_bench_rounding_parses_its_options_and_names_what_the_measurement_knows():
    import torch

    from localspec.bench import rounding

    args = parse("rounding", "--paths", "gguf", "nf4", "--setups", "engine", "fast", "--tokens", "4")
    assert args.bench_command == "rounding" and args.paths == ["gguf", "nf4"] and args.setups == ["engine", "fast"]
    assert bench_rounding.PATH_NAMES == tuple(rounding.PATHS)
    assert bench_rounding.SETUP_NAMES == (*rounding.setups(torch.bfloat16), "engine")
    with pytest.raises(SystemExit):
        parse("rounding", "--paths", "float64")
    with pytest.raises(ConfigError, match="at least one prompt"):
        bench_rounding.run(parse("rounding", "--gsm8k", "0", "--mt-bench", "0", "--humaneval", "0"))


@pytest.mark.slow
def test_bench_kernels_runs_a_small_case(tmp_path, capsys):
    """One build, every kernel at 1 row, one round: the tables land in --out (compiles the library: slow)."""
    pytest.importorskip("ctypes")
    from localspec.runtime.library import _missing

    if _missing() is not None:
        pytest.skip(f"the kernels' library cannot be built here: {_missing()}")
    out = tmp_path / "kernels.md"
    args = parse("kernels", "--rows", "1", "--repeats", "1", "--warmup", "0", "--cached", "16", "--out", str(out))
    assert bench_kernels.run(args) == 0
    text = out.read_text()
    assert text.count("| rows | working tree ms |") == 4 and text.count("\n| 1 |") == 4, text


def test_fidelity_counts_kl_and_agreement_as_defined():
    """KL(p ‖ q) of two known rows in closed form; agreement counted over all rows and over the clear ones."""
    import math

    import torch

    from localspec.bench.fidelity import GAP, Fidelity

    reference = torch.tensor([[2.0, 0.0, 0.0], [0.1, 0.0, 0.0]])  # row 0 clear (gap 2 ≥ GAP), row 1 a near-tie
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.3, 0.0]])  # row 0 the same, row 1 flipped
    tally = Fidelity()
    tally.add(reference, logits)
    p = torch.softmax(reference[1].double(), -1)
    q = torch.softmax(logits[1].double(), -1)
    kl = float((p * (p / q).log()).sum())
    assert GAP <= 2.0 and tally.positions == 2 and (tally.agree, tally.clear, tally.clear_agree) == (1, 1, 1)
    assert math.isclose(tally.kl_sum, kl, rel_tol=1e-9) and math.isclose(tally.kl_max, kl, rel_tol=1e-9)
    assert tally.row("x")[2:5] == [f"{kl / 2:.4f}", f"{kl:.3f}", "50.0%"]
    args = parse("fidelity", "--paths", "gguf", "--tokens", "3")
    assert (args.bench_command, args.paths, args.tokens) == ("fidelity", ["gguf"], 3)
    with pytest.raises(ConfigError, match="at least one prompt"):
        bench.TOOLS["fidelity"].run(parse("fidelity", "--gsm8k", "0", "--mt-bench", "0", "--humaneval", "0"))
