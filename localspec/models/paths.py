"""Where the app keeps its data. LOCALSPEC_HOME moves all of it."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    env = os.environ.get("LOCALSPEC_HOME")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("localspec", appauthor=False))


def cache_dir() -> Path:
    env = os.environ.get("LOCALSPEC_HOME")
    if env:
        return Path(env).expanduser() / "cache"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("localspec", appauthor=False))
