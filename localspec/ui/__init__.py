"""The Gradio chat window. build_app(manager) → Blocks; ModelManager loads pairs and serialises answers.

Gradio (and torch, through the engine) load on first use of these names, not on `import localspec.ui.serve`: the
app answers on its port (starting.py) before that import is done.
"""

import os

from localspec.config import Environment

# before gradio (or anything that imports it) is loaded
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
if not Environment.read().allow_download:  # local first: no hub traffic unless asked for
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from . import tempfiles  # noqa: E402  (no Gradio import inside)

tempfiles.use()  # Gradio's temporary files go under LOCALSPEC_HOME, owner-only, removed at exit

_WHERE = {
    "build_app": "layout",
    "launch_options": "layout",
    "Busy": "manager",
    "ModelManager": "manager",
    "default_session_factory": "manager",
}
__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{_WHERE[name]}", __name__), name)
