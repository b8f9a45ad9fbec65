"""`localspec serve`: the OpenAI-compatible API (/v1/models, /v1/chat/completions, /v1/completions) and /metrics
for one loaded pair, on 127.0.0.1 unless --host says otherwise (another host needs LOCALSPEC_API_KEY)."""

from __future__ import annotations

import sys

from localspec.server.admission import DEFAULT_MAX_WAITING

DEFAULT_PORT = 8000


def add_parser(sub) -> None:
    from localspec.server.guard import add_access_options

    from .common import add_model_options

    parser = sub.add_parser("serve", help="serve an OpenAI-compatible API with per-token provenance and /metrics")
    add_model_options(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s, this machine only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default: %(default)s)")
    parser.add_argument(
        "--max-queue",
        type=int,
        default=DEFAULT_MAX_WAITING,
        help="requests that may wait for the engine; one more gets 429 (default: %(default)s)",
    )
    parser.add_argument(
        "--no-auth",
        action="store_true",
        help="bind a non-loopback --host without LOCALSPEC_API_KEY (anyone reaching it can use it)",
    )
    add_access_options(parser)


def run(args) -> int:
    import uvicorn

    from localspec.server.admission import Admission
    from localspec.server.app import create_app
    from localspec.server.auth import api_key_for
    from localspec.server.guard import policy_for
    from localspec.server.metrics import MetricsRecorder
    from localspec.server.runner import FixedBackend

    from .common import load_session, read_pairs, resolve_pair

    api_key = api_key_for(args.host, args.no_auth)  # refuses before the model loads
    admission = Admission(args.max_queue)
    read = read_pairs(args.models)
    pairs = read[0]
    session = load_session(args, pair=resolve_pair(args, read))
    name = session.loaded.spec.name
    backend = FixedBackend(pairs, name, session)
    app = create_app(backend, admission, MetricsRecorder(admission), api_key, policy_for(args))
    print(
        f"Serving {name} on http://{args.host}:{args.port}/v1 (metrics: /metrics)"
        f"{'; clients must send Authorization: Bearer $LOCALSPEC_API_KEY' if api_key else ''}",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    admission.workers.stop()  # answers still running end before the interpreter does
    return 0
