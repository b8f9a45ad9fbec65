"""The speculative decoding engine: the loop (loop.py), the model runner and its cache, sampling, events, metrics and
the adaptive controller. Knows only token ids; never imports the UI.

Nothing is imported here, so that verify/ and proposers/ can use engine.sampling without loading the loop."""
