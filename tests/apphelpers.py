"""Start `python app.py` in a subprocess on a free 127.0.0.1 port, wait until it answers, stop it afterwards."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from .support import wait_until

REPO = Path(__file__).resolve().parents[1]


# set inside this pytest process by localspec's own imports: verify/triton_fused.py (no CUDA: Triton's interpreter)
# and ui/tempfiles.py (Gradio's temporary folder). An app a user starts has neither unless the user set them.
SET_BY_OUR_IMPORTS = ("TRITON_INTERPRET", "GRADIO_TEMP_DIR")


def child_env(**extra: str) -> dict[str, str]:
    """The environment for an app the tests start: this process's, less what our imports set here."""
    from .conftest import STARTING_ENV

    env = {k: v for k, v in os.environ.items() if k in STARTING_ENV or k not in SET_BY_OUR_IMPORTS}
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tiny_models_yaml(tiny_pair: dict, folder: Path) -> Path:
    """The tiny pair plus an entry whose model folder does not exist (to fail a switch on purpose)."""
    text = Path(tiny_pair["models_yaml"]).read_text()
    root = Path(tiny_pair["root"])
    text = text.replace("source: tiny-target", f"source: {root / 'tiny-target'}")
    text = text.replace("source: tiny-draft", f"source: {root / 'tiny-draft'}")
    text += (
        "- name: missing\n"
        f"  target: {{source: {folder / 'no-such-model'}, quant: none, dtype: float32}}\n"
        "  proposers:\n"
        "    ngram: {min_n: 1, max_n: 3}\n"
    )
    path = folder / "models.yaml"
    path.write_text(text)
    return path


LOAD_ENDED = ("\nLoaded ", "localspec: could not load ")  # serve.py's lines when the first pair's load ends


class AppProcess:
    def __init__(self, models: Path, home: Path, extra: tuple[str, ...] = (), port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log_path = Path(home) / f"app-{self.port}.log"
        env = child_env(
            LOCALSPEC_HOME=str(home),
            GRADIO_ANALYTICS_ENABLED="False",
            HF_HUB_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        )
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "app.py"),
                "--models",
                str(models),
                "--no-browser",
                "--port",
                str(self.port),
                "--device",
                "cpu",
                *extra,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )

    def wait_ready(self, timeout_s: float = 180.0) -> AppProcess:
        """Served, and the first pair's load ended (loaded or failed): the window is served before it loads."""
        self.wait_serving(timeout_s)

        def loaded() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"app exited with {self.proc.returncode}:\n{self.log_text()}")
            text = "\n" + self.log_text(None)
            return any(line in text for line in LOAD_ENDED)

        if not wait_until(loaded, timeout_s, every_s=0.5, fail=False):
            raise RuntimeError(f"the first pair did not load in {timeout_s:.0f} s:\n{self.log_text()}")
        return self

    def wait_serving(self, timeout_s: float = 180.0) -> AppProcess:
        """The port answers (the first pair may still be loading)."""

        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"app exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                with urllib.request.urlopen(self.url + "config", timeout=2) as response:
                    return response.status == 200
            except urllib.error.HTTPError:  # it answers (e.g. 401 behind a password): it is up
                return True
            except OSError:
                return False

        if not wait_until(up, timeout_s, every_s=0.5, fail=False):
            raise RuntimeError(f"app did not start in {timeout_s:.0f} s:\n{self.log_text()}")
        return self

    def log_text(self, tail: int | None = 4000) -> str:
        self.log.flush()
        text = self.log_path.read_text(errors="replace")
        return text[-tail:] if tail else text

    def kill(self) -> None:
        """kill -9: no chance to clean up."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


def send(client, message, proposer="ngram", k=3, temperature=0.0, max_new=48, seed=0):
    """Submit one message through the app's /send endpoint (top-p 1, top-k 0, colouring on); returns the Job."""
    return client.submit(message, proposer, k, temperature, 1.0, 0, max_new, seed, True, api_name="/send")


def send_from_two_clients(url: str, prompts: list[str], max_new: int = 40) -> dict[int, tuple]:
    """Two gradio clients send at the same moment; returns each one's final outputs, by client index."""
    import threading

    from gradio_client import Client

    results: dict[int, tuple] = {}

    def run(i):
        results[i] = send(Client(url, verbose=False), prompts[i], max_new=max_new).result(timeout=120)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    return results
