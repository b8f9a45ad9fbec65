"""The `localspec` command. Each subcommand lives in localspec/cli/<name>.py with add_parser() and run()."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

LOADS_A_MODEL = ("generate", "serve", "bench", "selftest")
COMMANDS = ("generate", "selftest", "bench", "bench_sampler", "distill", "evaluate_head", "serve", "models")


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    given = sys.argv[1:] if argv is None else argv
    if given and given[0] in LOADS_A_MODEL and not {"-h", "--help"} & set(given):
        from localspec.runtime.library import prebuild_here

        prebuild_here()  # a first start compiles the kernels' library while torch is imported and the file read
    parser = argparse.ArgumentParser(prog="localspec", description="Local speculative decoding that shows its work.")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"localspec.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"localspec.cli.{name}":
                continue  # not built yet
            raise
        module.add_parser(sub)
        modules[name.replace("_", "-")] = module
    args = parser.parse_args(argv)
    from localspec.config import ConfigError

    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:  # started with it closed (>&-): what goes there goes nowhere
            setattr(sys, name, open(os.devnull, "w"))
    try:
        return int(modules[args.command].run(args) or 0)
    except ConfigError as exc:
        print(f"localspec: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as Unix tools do
        discard_stdout()
        return 128 + signal.SIGPIPE


def discard_stdout() -> None:
    """Point stdout at /dev/null so that the flush at interpreter exit does not raise BrokenPipeError again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
