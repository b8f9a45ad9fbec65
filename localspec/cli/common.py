"""Options shared by the subcommands that load a model pair."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from localspec.config import PROPOSERS, QUANTS, SAMPLERS

DEFAULT_MODELS_YAML = Path(__file__).resolve().parents[2] / "models.yaml"


def positive_int(text: str) -> int:
    """An argparse type: an integer ≥ 1, else argparse's own message."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1 (got {value})")
    return value


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=str(DEFAULT_MODELS_YAML), help="models.yaml to read (default: %(default)s)")
    parser.add_argument("--model", default=None, help="model pair name from models.yaml (default: the first entry)")
    parser.add_argument(
        "--model-file",
        default=None,
        metavar="PATH",
        help="answer with this GGUF file (or transformers folder) as the target, with the n-gram and history "
        "lookups, instead of a models.yaml entry",
    )
    parser.add_argument("--quant", choices=QUANTS, default=None, help="override the entry's target quantization")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument(
        "--exact",
        choices=("auto", "on", "off"),
        default=None,
        help="the target's exact forward setup (bitwise-equal rows; default: the entry's setting, auto = on where "
        "it costs ≤ 1.25× the fast one, timed once per machine)",
    )


def add_spec_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--proposer", choices=PROPOSERS, default=None, help="default: the entry's default_proposer")
    parser.add_argument("--k", type=int, default=None, help="draft tokens per step (default: the entry's k)")
    parser.add_argument("--sampler", choices=SAMPLERS, default="auto", help="rejection sampler implementation")
    parser.add_argument(
        "--adaptive",
        choices=("on", "off"),
        default=None,
        help="pick K ≤ --k each step from measured costs (off = always K); default: the entry's setting",
    )


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument(
        "--repetition-penalty", type=float, default=1.0, help="vLLM's: > 1 lowers every token seen so far (1 = off)"
    )
    parser.add_argument(
        "--frequency-penalty", type=float, default=0.0, help="OpenAI's, -2..2: minus it times a token's count"
    )
    parser.add_argument(
        "--presence-penalty", type=float, default=0.0, help="OpenAI's, -2..2: minus it once a token is in the answer"
    )


def read_pairs(path) -> list:
    """models.yaml's valid entries; each broken one is named in a warning on stderr (as the app offers the rest)."""
    from localspec.models.registry import load_registry_lenient

    pairs, broken = load_registry_lenient(path)
    for entry in broken:
        print(f"localspec: warning: skipped {entry.error}", file=sys.stderr, flush=True)
    return pairs, broken


def resolve_pair(args, read=None):
    """The models.yaml entry --model names (default: the first valid one, as in the app), or the pair --model-file
    makes, read without loading anything (or from `read`, what read_pairs returned). A broken entry it was not
    asked to use only gives a warning; one asked for by name gives its error."""
    from localspec.config import ConfigError
    from localspec.models.registry import find_pair, parse_pair

    if args.model_file:
        from localspec.models.user_models import file_entry

        return parse_pair(file_entry(model_file(args.model_file)), 0, Path.cwd())
    pairs, broken = read if read is not None else read_pairs(args.models)
    asked = next((b for b in broken if args.model is not None and b.name == args.model), None)
    if asked is not None:
        raise ConfigError(asked.error)
    return find_pair(pairs, args.model)


def model_file(text: str) -> Path:
    """--model-file's path, resolved: a readable file, or a folder with a config.json; else a one-line ConfigError
    that says what is wrong with it (missing, a symlink loop, a folder, unreadable, a FIFO)."""
    import errno
    import stat

    from localspec.config import ConfigError
    from localspec.models.untrusted import kind_of, open_regular, shown

    where = f"--model-file {shown(text)}"
    try:
        path = Path(text).expanduser().resolve(strict=True)
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            if not (path / "config.json").is_file():
                raise ConfigError(f"{where} is a folder without config.json; give a GGUF file or a transformers folder")
        elif stat.S_ISREG(mode):
            open_regular(path).close()
        else:
            raise ConfigError(f"{where} is {kind_of(mode)}, not a model file")
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist") from None
    except RuntimeError as exc:  # a symlink loop (Python < 3.13), ~nosuchuser
        why = "is a symlink loop" if "loop" in str(exc).lower() else f"is not a usable path ({exc})"
        raise ConfigError(f"{where} {why}") from None
    except OSError as exc:
        why = "is a symlink loop" if exc.errno == errno.ELOOP else f"cannot be read: {exc.strerror or exc}"
        raise ConfigError(f"{where} {why}") from None
    return path


def check_spec_options(args, pair) -> None:
    """--proposer, --k and --sampler against the entry, before any model loads (a refusal takes no time)."""
    from localspec.config import ConfigError, SpecConfig

    spec = SpecConfig(
        proposer=args.proposer or pair.default_proposer, k=pair.k if args.k is None else args.k, sampler=args.sampler
    ).validate()
    if spec.proposer not in pair.proposers:
        raise ConfigError(
            f"model pair {pair.name!r} has no {spec.proposer!r} proposer; it has: {', '.join(pair.proposers)}"
        )


def load_session(args, load_draft: bool = True, pair=None):
    """Load the pair named by --model (or the given one; progress on stderr) and return a ChatSession."""
    from localspec.chat import ChatSession
    from localspec.models import loading

    loaded = loading.load_pair(
        pair or resolve_pair(args),
        quant=args.quant,
        device=args.device,
        load_draft=load_draft,
        progress=lambda msg: print(msg, file=sys.stderr, flush=True),
        exact=args.exact,
    )
    return ChatSession(loaded)
