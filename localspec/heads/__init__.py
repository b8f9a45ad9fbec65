"""Feature-level draft heads (MTP, EAGLE, Eagle3) that read the target's last hidden state."""

from .config import HEAD_KINDS, HeadConfig, target_shapes
from .io import load_head, save_head
from .model import FeatureHead

__all__ = ["HEAD_KINDS", "HeadConfig", "FeatureHead", "load_head", "save_head", "target_shapes"]
