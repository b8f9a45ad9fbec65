"""The Gradio chat window. build_app(manager) → Blocks; ModelManager loads pairs and serialises answers."""

import os

from localspec.config import Environment

# before gradio (or anything that imports it) is loaded
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
if not Environment.read().allow_download:  # local first: no hub traffic unless asked for
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from . import tempfiles  # noqa: E402  (no Gradio import inside)

tempfiles.use()  # Gradio's temporary files go under LOCALSPEC_HOME, owner-only, removed at exit

from .layout import build_app, launch_options
from .manager import Busy, ModelManager, default_session_factory

__all__ = ["build_app", "launch_options", "Busy", "ModelManager", "default_session_factory"]
