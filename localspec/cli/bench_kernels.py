"""`localspec bench kernels`: the kernels' library per row count, the working tree's build against another git
revision's, interleaved call by call; whether the builds give the same bits, and what each call costs.

    localspec bench kernels --against HEAD~1 --kernels q4 attention --rows 1 2 5 9

For a change that must not move a bit (a faster loop over the same arithmetic) the "same bits" column says whether it
held (the command exits 1 where it did not); the table says what it bought.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from localspec.config import ConfigError

from .common import positive_int


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "kernels",
        help="time the kernels' library per row count, against another revision's build",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--against", metavar="REV", help="also build the library from this git revision's sources (e.g. HEAD, main)"
    )
    parser.add_argument(
        "--against-march",
        metavar="ARCH",
        help="build the compared library for this -march (e.g. haswell: the AVX2 code on an AVX-512 machine)",
    )
    parser.add_argument(
        "--kernels", nargs="+", default=["q4", "q8", "attention", "layer"], metavar="K", help="q4 q8 attention layer"
    )
    parser.add_argument("--rows", nargs="+", type=positive_int, default=[1, 2, 3, 5, 9, 17], metavar="R")
    parser.add_argument(
        "--cached", type=int, default=600, help="positions cached before the rows (attention, layer; %(default)s)"
    )
    parser.add_argument("--repeats", type=positive_int, default=25, help="timed rounds (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=3, help="rounds before the timed ones (default: %(default)s)")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads (default: %(default)s)")
    parser.add_argument("--out", type=Path, help="also write the tables to this markdown file")


def run(args) -> int:
    import torch

    from localspec.bench import kernels as bench
    from localspec.bench.interleave import interleave, medians, ratio, table

    unknown = sorted(set(args.kernels) - set(bench.KERNEL_NAMES))
    if unknown:
        raise ConfigError(f"unknown kernel {', '.join(unknown)}; choose from {', '.join(bench.KERNEL_NAMES)}")
    if args.cached < 0 or args.warmup < 0:
        raise ConfigError("--cached and --warmup must be ≥ 0")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        builds = [bench.load_build("working tree", list(bench.SOURCES), folder / "tree.so")]
        if args.against or args.against_march:
            rev, march = args.against, args.against_march or "native"
            sources = bench.sources_at(rev, folder / "rev") if rev else list(bench.SOURCES)
            name = " ".join(part for part in (rev or "working tree", args.against_march) if part)
            builds.append(bench.load_build(name, sources, folder / "rev.so", march))
    lines = [f"{builds[0].isa}, {args.threads} threads, median ms of "
             f"{args.repeats} interleaved rounds after {args.warmup}"]  # fmt: skip
    same_everywhere = True
    for kernel in args.kernels:
        present = [build for build in builds if build.kernel(kernel) is not None]
        for build in builds:
            if build.kernel(kernel) is None:
                lines.append(f"\n{kernel} on {build.name}: {build.missing.get(kernel, 'not loaded')}")
        if not present:
            continue
        header = ["rows", *(f"{build.name} ms" for build in present)]
        header += ["÷", "same bits"] if len(present) == 2 else []
        rows = []
        for count in args.rows:
            prepared = bench.prepare(kernel, count, args.cached)
            calls = {build.name: prepared(build) for build in present}
            outputs = [call() for call in calls.values()]
            same = all(torch.equal(outputs[0], out) for out in outputs[1:])
            same_everywhere = same_everywhere and same
            ms = medians(interleave(calls, args.repeats, args.warmup))
            cells = [count, *(f"{ms[build.name]:.3f}" for build in present)]
            if len(present) == 2:
                cells += [ratio(ms[present[1].name], ms[present[0].name]), "yes" if same else "NO"]
            rows.append(cells)
            print(f"{kernel} {count} rows: " + ", ".join(f"{name} {v:.3f} ms" for name, v in ms.items()), flush=True)
        where = f", {args.cached} cached" if kernel in ("attention", "layer") else ""
        lines += ["", f"{bench.WHAT[kernel]}{where}", "", table(header, rows)]
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0 if same_everywhere else 1
