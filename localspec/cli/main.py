"""The `localspec` command. Each subcommand lives in localspec/cli/<name>.py with add_parser() and run()."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

COMMANDS = ("generate", "selftest", "bench", "bench_sampler", "distill", "evaluate_head", "serve", "models")


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
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

    try:
        return int(modules[args.command].run(args) or 0)
    except ConfigError as exc:
        print(f"localspec: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
