"""`python app.py --api`: the API routes on the chat app's own server (Gradio 6 runs on FastAPI).

The routes go to Gradio's app through launch(app_kwargs={'routes': …}) (FastAPI(routes=…)), ahead of Gradio's own.
The chat window and the API share one FIFO Admission (the manager's lock) and one MetricsRecorder (the manager's
observer), so chat answers count in /metrics and wait in the same queue as API requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .admission import Admission
from .auth import api_key_for
from .metrics import MetricsRecorder, observer_for


@dataclass
class ApiParts:
    admission: Admission
    metrics: MetricsRecorder
    api_key: str | None
    manager_options: dict = field(default_factory=dict)  # ModelManager(admission=…, observer=…)

    @classmethod
    def for_host(cls, host: str, no_auth: bool) -> ApiParts:
        api_key = api_key_for(host, no_auth)  # ConfigError before anything loads
        admission = Admission()
        metrics = MetricsRecorder(admission)
        return cls(admission, metrics, api_key, {"admission": admission, "observer": observer_for(metrics)})

    def app_kwargs(self, manager) -> dict:
        from .app import build_routes
        from .runner import ManagerBackend

        return {"routes": build_routes(ManagerBackend(manager), self.admission, self.metrics, self.api_key)}
