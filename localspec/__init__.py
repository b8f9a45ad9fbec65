"""localspec: local speculative decoding that shows its work."""

__version__ = "0.1.0"
