"""The base layer: sampling, token trees, the model runner with its static cache, compile modes, hidden-state
features and the synced clock. Knows only tensors and token ids; imports nothing above it (engine, proposers,
verify, heads sit on it)."""
