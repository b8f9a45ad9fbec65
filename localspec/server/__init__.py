"""The OpenAI-compatible HTTP API and /metrics. Importing this package loads nothing heavy: the FastAPI app is in
app.py, the FIFO admission every caller of the engine shares in admission.py, the Prometheus recorder in metrics.py."""
