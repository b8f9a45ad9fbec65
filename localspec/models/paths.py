"""Where the app keeps its data. LOCALSPEC_HOME moves all of it."""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
from pathlib import Path

from localspec.config import Environment, cache_dir  # noqa: F401  (cache_dir: found here by its callers)


def home() -> Path:
    env = Environment.read().home
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("localspec", appauthor=False))


def folder_problem(exc: OSError) -> str:
    """What is wrong with the data folder, for a message that says what to do."""
    reason = exc.strerror or type(exc).__name__
    where = f" ({exc.filename})" if exc.filename else ""
    return f"the data folder {home()} cannot be written: {reason}{where}; set LOCALSPEC_HOME to a writable folder"


_fallbacks: dict[Path, Path] = {}


def writable_folder(folder: Path, what: str) -> Path:
    """`folder`, created if needed; when the data folder is a file or read-only, a private temporary folder for
    this process instead (removed at exit), after a warning on stderr saying that `what` is not kept."""
    if folder in _fallbacks:
        return _fallbacks[folder]
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
        return folder
    except OSError as exc:
        fallback = Path(tempfile.mkdtemp(prefix="localspec-"))
        atexit.register(shutil.rmtree, fallback, True)
        print(f"localspec: {folder_problem(exc)}. {what} goes to {fallback} for this run only.", file=sys.stderr)
        _fallbacks[folder] = fallback
        return fallback
