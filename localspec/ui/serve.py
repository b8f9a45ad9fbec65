"""The chat app's process: `python app.py` (this module's main) opens the local chat app on the first models.yaml entry.

Options: --models PATH, --model NAME, --host, --port, --no-browser, --device, --password / LOCALSPEC_PASSWORD,
--no-auth, --no-save, --api, --allowed-host NAME / LOCALSPEC_ALLOWED_HOSTS, --cors-origin ORIGIN /
LOCALSPEC_CORS_ORIGINS (server/guard.py: the Host check and CORS). Conversations are saved in
$LOCALSPEC_HOME/conversations.db (or the user data folder).
Binds 127.0.0.1 unless --host says otherwise; another host needs a password (or --no-auth on purpose). There is never
a public share link.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from localspec.config import Environment
from localspec.server.auth import is_loopback  # one loopback rule for the app and the API
from localspec.server.guard import add_access_options, guard_lifespan, policy_for

from .starting import StartingPage

REPO = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="app.py", description="localspec: a local speculative-decoding chat app")
    parser.add_argument(
        "--models", default=str(REPO / "models.yaml"), help="models.yaml to read (default: %(default)s)"
    )
    parser.add_argument("--model", default=None, help="pair to load first (default: the first entry)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s, this machine only)")
    parser.add_argument("--port", type=int, default=None, help="port (default: the first free one from 7860)")
    parser.add_argument("--no-browser", action="store_true", help="do not open the default web browser")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument(
        "--password",
        default=None,
        help="password asked for when binding to a non-loopback --host (other users can see it in "
        "the process list: prefer LOCALSPEC_PASSWORD)",
    )
    parser.add_argument("--no-save", action="store_true", help="do not save conversations")
    parser.add_argument(
        "--no-scan",
        action="store_true",
        help="do not offer the models found on this machine (LM Studio, Ollama, llama.cpp, Hugging Face cache)",
    )
    parser.add_argument(
        "--no-auth",
        action="store_true",
        help="bind a non-loopback --host without a password (anyone who can reach it can use it)",
    )
    parser.add_argument(
        "--api",
        action="store_true",
        help="also serve the OpenAI-compatible API (/v1/...) and /metrics on the same port; another "
        "--host needs LOCALSPEC_API_KEY (or --no-auth)",
    )
    add_access_options(parser)
    return parser.parse_args(argv)


def auth_for(args: argparse.Namespace):
    """None on loopback; otherwise a password check, unless --no-auth. Raises ConfigError when none is given."""
    from localspec.config import ConfigError

    if is_loopback(args.host) or args.no_auth:
        return None
    password = args.password or Environment.read().password
    if not password:
        raise ConfigError(
            f"binding to {args.host} makes the app reachable from other machines; give a password with "
            f"--password or LOCALSPEC_PASSWORD (or pass --no-auth on purpose)"
        )
    return lambda _user, given: given == password


def api_parts(args: argparse.Namespace):
    """With --api: the shared queue, metrics and API routes (localspec/server/mount.py); None otherwise."""
    if not args.api:
        return None
    from localspec.server.mount import ApiParts

    return ApiParts.for_host(args.host, args.no_auth)


def open_store(args: argparse.Namespace):
    """The conversation store (None with --no-save or when it cannot be opened) and a notice for the user."""
    if args.no_save:
        return None, "Conversations are not saved (--no-save)."
    try:
        from localspec.store.db import ConversationStore, StoreError
    except ImportError:  # the store is not part of this checkout
        return None, None
    try:
        store = ConversationStore()
    except StoreError as exc:
        print(f"localspec: conversations will not be saved: {exc}", file=sys.stderr, flush=True)
        return None, f"Conversations will not be saved: {exc}"
    print(f"Saving conversations to {store.path}", file=sys.stderr, flush=True)
    if store.recovered_from is not None:
        notice = (
            f"The conversation database was damaged; it was moved to {store.recovered_from} and a fresh one "
            f"was started."
        )
        print(f"localspec: {notice}", file=sys.stderr, flush=True)
        return store, notice
    return store, None


def load_first(manager, name: str) -> None:
    """Load the first pair (in its own thread, the window already served); a failure leaves the app open, the
    window says why and offers the other pairs."""
    from localspec.config import ConfigError

    try:
        seconds = manager.load(name, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
        print(f"Loaded {name} in {seconds:.1f} s", file=sys.stderr, flush=True)
    except ConfigError as exc:
        print(f"localspec: could not load {name}: {exc}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.umask(0o077)  # everything the app writes (database, exports, Gradio's copies) is readable by its owner only
    from localspec.config import ConfigError
    from localspec.models.registry import find_pair
    from localspec.models.user_models import Catalog

    try:  # the port answers first; the window takes its place once built (Gradio and torch take seconds to import)
        starting = StartingPage(args.host, args.port)
    except OSError as exc:  # port taken, address not available
        print(f"localspec: cannot serve on {args.host}:{args.port or 7860}: {exc}", file=sys.stderr)
        return 2
    print(f"localspec: starting on http://{args.host}:{starting.port}/", file=sys.stderr, flush=True)
    from localspec.runtime.library import prebuild_here

    prebuild_here()  # a first start compiles the kernels' library while Gradio and torch are imported
    catalog = Catalog(Path(args.models), scan=not args.no_scan)
    try:  # the models on this machine are read while the starting page answers (a large folder takes a while)
        auth = auth_for(args)
        api = api_parts(args)
        read = catalog.read()
        pairs, broken, found = read.pairs, read.broken, read.found
        first = find_pair(pairs, args.model)
    except ConfigError as exc:
        starting.close()
        print(f"localspec: {exc}", file=sys.stderr)
        return 2
    for entry in broken:  # offered in the window as unavailable, with this error
        print(f"localspec: skipped {entry.error}", file=sys.stderr, flush=True)
    if found is not None and found.models:
        usable = sum(1 for m in found.models if m.loadable is None)
        print(
            f"localspec: found {len(found.models)} model(s) on this machine, {usable} loadable "
            "(`localspec models` lists them)",
            file=sys.stderr,
            flush=True,
        )
    from . import ModelManager, build_app, default_session_factory, launch_options
    from .auth import launch_kwargs

    manager = ModelManager(
        pairs, default_session_factory(args.device), broken=broken, **api.manager_options if api else {}
    )
    manager.attach_catalog(catalog, read)
    store, notice = open_store(args)
    demo = build_app(manager, store, notice)
    demo.queue(default_concurrency_limit=None)
    # SIGTERM ends the process like Ctrl+C: the answers stop (an incomplete one is kept as such) and their threads
    # end before the interpreter does, the store checkpoints its WAL, the temporary files go (atexit)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    launch = launch_kwargs(auth)
    # the Host check and CORS (server/guard.py) go around everything Gradio serves, the API routes included
    launch["app_kwargs"] = {**launch.get("app_kwargs", {}), "lifespan": guard_lifespan(policy_for(args))}
    if api:  # the API's routes go on the same FastAPI app as the login middleware
        launch["app_kwargs"].update(api.app_kwargs(manager))
    try:
        starting.close()
        # quiet: Gradio's own lines include "To create a public link, set `share=True`", which this app never does
        demo.launch(
            server_name=args.host,
            server_port=starting.port,
            inbrowser=not args.no_browser,
            share=False,
            auth_message="localspec: enter the password (any user name)" if auth else None,
            show_error=True,
            quiet=True,
            prevent_thread_lock=True,
            **launch,
            **launch_options(),
        )
        # served first, loaded second: the window answers at once and shows the load's stages as they pass
        threading.Thread(target=load_first, args=(manager, first.name), daemon=True, name="localspec-load").start()
        reach = (
            "this machine only"
            if is_loopback(args.host)
            else "other machines can connect; password required"
            if auth
            else "other machines can connect, WITHOUT a password (--no-auth)"
        )
        print(
            f"localspec: serving on {demo.local_url} ({reach}; never shared publicly). Ctrl+C stops it.",
            file=sys.stderr,
            flush=True,
        )
        demo.block_thread()
    except OSError as exc:  # port taken, address not available
        print(f"localspec: cannot serve on {args.host}:{args.port or 7860}: {exc}", file=sys.stderr)
        return 2
    finally:
        manager.stop_answers()
        if store is not None:
            store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
