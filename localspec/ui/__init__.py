"""The Gradio chat window. build_app(manager) → Blocks; ModelManager loads pairs and serialises answers."""
from .layout import build_app, launch_options
from .manager import Busy, ModelManager, default_session_factory

__all__ = ["build_app", "launch_options", "Busy", "ModelManager", "default_session_factory"]
