"""Soak: `python app.py` on two tiny pairs, two gradio clients, SOAK_ANSWERS answers with random settings, random
Stop presses, clears and pair switches. Loopback only; bounded by count and by SOAK_LIMIT_S (it stops by itself).

Afterwards the database holds exactly the answers the clients saw (none lost, none twice), passes
`PRAGMA integrity_check`, every answer is finished (stop / length / cancelled) or marked incomplete, and the app's
RSS grew less than 5 % between warm-up and the end (both taken with both clients idle). The figures are printed
(pytest -s shows them).
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from .apphelpers import AppProcess, tiny_models_yaml

SOAK_ANSWERS = 200
SOAK_LIMIT_S = 900.0
WARMUP_ANSWERS = 40
PAIRS = ("tiny", "tiny-b")
IDLE_WAIT_S = 1.0  # longer than one step of the tiny pairs, even on a loaded machine


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def idle_rss_kib(pid: int) -> int:
    """RSS once the app is idle: a Stop returns to the client before the engine's step ends, so wait that out."""
    time.sleep(IDLE_WAIT_S)
    return rss_kib(pid)


def two_pairs_yaml(tiny_pair, folder: Path) -> Path:
    """The tiny pairs on the fast forward setup, named: `exact: auto` would pick a path by timing it, so a soak would
    test one path on one run and the other on the next (the exact path's RSS is an open finding:
    docs/performance.md)."""
    path = tiny_models_yaml(tiny_pair, folder)
    root = Path(tiny_pair["root"])
    text = path.read_text().replace("- name: tiny\n", "- name: tiny\n  exact: false\n", 1)
    assert "exact: false" in text
    path.write_text(
        text
        + (
            "- name: tiny-b\n"
            "  exact: false\n"
            f"  target: {{source: {root / 'tiny-target'}, quant: none, dtype: float32}}\n"
            "  proposers:\n"
            "    ngram: {min_n: 1, max_n: 2}\n"
        )
    )
    return path


class Soak:
    def __init__(self, url: str, seed: int) -> None:
        self.url = url
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.answered: list[tuple[str, str]] = []  # (text, finish reason) of every answer a client saw
        self.refused = Counter()
        self.stops = self.switches = self.clears = 0
        self.count = 0  # answers done by both clients
        self.deadline = time.monotonic() + SOAK_LIMIT_S
        self.warm_rss: int | None = None
        self.warmup_hook = None
        self.warm_barrier = threading.Barrier(2, action=self._sample_warm)  # both clients between answers

    def _sample_warm(self) -> None:
        if self.warmup_hook:
            self.warm_rss = self.warmup_hook()

    def next_ticket(self) -> bool:
        with self.lock:
            at_warmup = self.count == WARMUP_ANSWERS and self.warm_rss is None
        if at_warmup:  # the warm-up figure is taken idle, as the end one is: like against like
            self.warm_barrier.wait(timeout=300)
        with self.lock:
            if self.count >= SOAK_ANSWERS or time.monotonic() > self.deadline:
                return False
            self.count += 1
            return True

    def client_loop(self, seed: int) -> None:
        from gradio_client import Client

        try:
            self._client_loop(seed, Client)
        finally:
            if self.warm_rss is None:  # gone before the warm-up figure: the other client must not wait for it
                self.warm_barrier.abort()

    def _client_loop(self, seed: int, Client) -> None:
        rng = random.Random(seed)
        client = Client(self.url, verbose=False)
        while self.next_ticket():
            if rng.random() < 0.05:
                client.predict(rng.choice(PAIRS), api_name="/switch_model")
                with self.lock:
                    self.switches += 1
            if rng.random() < 0.1:
                client.predict(api_name="/clear")
                with self.lock:
                    self.clears += 1
            job = client.submit(
                f"soak {seed} {rng.randrange(10**6)} " + "word " * rng.randrange(1, 12),
                rng.choice(("ngram", "ngram", "draft", "none")),
                rng.randrange(1, 9),
                rng.choice((0.0, 0.0, round(rng.uniform(0.1, 1.5), 2))),
                rng.choice((1.0, 0.9)),
                rng.choice((0, 0, 20)),
                rng.randrange(4, 40),
                rng.randrange(1000),
                True,
                api_name="/send",
            )
            if rng.random() < 0.25:
                time.sleep(rng.uniform(0.0, 0.3))
                client.predict(api_name="/stop")
                with self.lock:
                    self.stops += 1
            _transcript, _stats, status, events, _box = job.result(timeout=180)
            with self.lock:
                if "Done:" in status or "Stopped after" in status or "Stopped before the first token" in status:
                    text = "".join(t["text"] for t in events["tokens"])
                    self.answered.append((text, events["finish_reason"]))
                else:
                    self.refused[status.split(">", 1)[1].split(";")[0][:60]] += 1


@pytest.mark.slow
def test_soak(tiny_pair, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    app = AppProcess(two_pairs_yaml(tiny_pair, tmp_path), home).wait_ready()
    soak = Soak(app.url, 0)
    soak.warmup_hook = lambda: idle_rss_kib(app.proc.pid)
    started = time.monotonic()
    try:
        threads = [threading.Thread(target=soak.client_loop, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(SOAK_LIMIT_S + 240)
        duration = time.monotonic() - started
        end_rss = idle_rss_kib(app.proc.pid)
    finally:
        app.stop()  # SIGTERM: a clean shutdown
    answered = Counter(soak.answered)
    print(
        f"\nsoak: {soak.count} sends ({len(soak.answered)} answered, {sum(soak.refused.values())} refused: "
        f"{dict(soak.refused)}), {soak.stops} stops, {soak.switches} switches, {soak.clears} clears in "
        f"{duration:.0f} s; app RSS {soak.warm_rss} KiB after {WARMUP_ANSWERS} sends, {end_rss} KiB at the end "
        f"({(end_rss / soak.warm_rss - 1) * 100:+.1f} %)"
    )
    assert soak.count == SOAK_ANSWERS, f"only {soak.count} sends in {SOAK_LIMIT_S:.0f} s"
    assert not any(t.is_alive() for t in threads)

    with sqlite3.connect(f"file:{home / 'conversations.db'}?mode=ro", uri=True) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = db.execute("SELECT content, finish_reason, complete FROM messages WHERE role = 'assistant'").fetchall()
        users = db.execute("SELECT COUNT(*) FROM messages WHERE role = 'user'").fetchone()[0]
        token_text = dict(
            db.execute(
                "SELECT message_id, GROUP_CONCAT(text, '') FROM (SELECT message_id, text FROM "
                "tokens ORDER BY message_id, seq) GROUP BY message_id"
            ).fetchall()
        )
        contents = dict(db.execute("SELECT id, content FROM messages WHERE role = 'assistant'").fetchall())
    stored = Counter((content, reason) for content, reason, _complete in rows)
    assert stored == answered, f"lost: {answered - stored}; not seen by a client or twice: {stored - answered}"
    assert users == len(rows)  # each answer has its message, and a refused one left neither
    assert all(reason in ("stop", "length", "cancelled") and complete for _c, reason, complete in rows)
    assert all(token_text.get(mid, "") == text for mid, text in contents.items())  # token rows match the text
    assert soak.stops and soak.switches and len(soak.answered) >= SOAK_ANSWERS // 2
    assert end_rss < soak.warm_rss * 1.05, f"RSS grew from {soak.warm_rss} to {end_rss} KiB after warm-up"
