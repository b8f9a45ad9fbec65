"""`localspec generate --json` returns the documented object, for every proposer."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test starts `python -m localspec` in a subprocess

REPO = Path(__file__).resolve().parents[1]


def generate(*args, models=None):
    cmd = [sys.executable, "-m", "localspec", "generate", "--json", *args]
    if models:
        cmd += ["--models", str(models)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    return proc


def check_json(proc):
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out) >= {"text", "token_ids", "events", "stats"}
    assert [e["id"] for e in out["events"]] == out["token_ids"]
    assert "".join(e["text"] for e in out["events"]) == out["text"]
    assert {
        "drafted",
        "accepted",
        "acceptance_rate",
        "mean_acceptance_length",
        "tokens_per_s",
        "target_forwards",
    } <= set(out["stats"])
    return out


@pytest.mark.parametrize("proposer", ["none", "ngram", "draft"])
def test_generate_json_tiny(tiny_pair, proposer):
    out = check_json(
        generate("--prompt", "hi", "--proposer", proposer, "--max-new-tokens", "16", models=tiny_pair["models_yaml"])
    )
    kinds = {e["kind"] for e in out["events"]}
    assert (kinds == {"target"}) if proposer == "none" else kinds <= {"accepted", "resampled", "bonus", "target"}
    assert len(out["token_ids"]) <= 16
    if proposer == "draft":  # the draft model's cost, timed at load: its controllers' prior
        assert out["propose_priors"]["draft"] > 0
    plan = out["plan"]  # the target's forward plan: each choice with its reason
    assert plan["setup"] in ("fast", "exact", "exact-kernels", "exact-attention") and plan["summary"].startswith(
        plan["setup"]
    )
    for name in (
        "library",
        "lm_head",
        "decode_attention",
        "prefill_attention",
        "dummy_rows",
        "layer_kernel",
        "threads",
        "forward",
    ):
        assert plan[name]["value"] and plan[name]["reason"], name


def test_generate_stops_at_a_stop_string_and_takes_the_penalties(tiny_pair):
    models = tiny_pair["models_yaml"]
    plain = check_json(generate("--prompt", "hi", "--proposer", "ngram", "--max-new-tokens", "24", models=models))
    text = plain["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert len(text) >= 8 and stop, text
    proc = generate("--prompt", "hi", "--proposer", "ngram", "--max-new-tokens", "24", "--stop", stop, models=models)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cut = json.loads(proc.stdout.strip().splitlines()[-1])
    assert cut["text"] == text[: text.find(stop)] and cut["finish_reason"] == "stop"
    assert "".join(e["text"] for e in cut["events"]).startswith(cut["text"])  # the last token may run past the cut
    assert cut["token_ids"] == plain["token_ids"][: len(cut["token_ids"])]
    penalized = generate("--prompt", "hi", "--max-new-tokens", "8", "--repetition-penalty", "1.3", models=models)
    check_json(penalized)
    refused = generate("--prompt", "hi", "--repetition-penalty", "0", models=models)
    assert refused.returncode == 2 and "repetition penalty must be a number > 0" in refused.stderr


def test_bad_arguments_give_a_message_not_a_traceback(tiny_pair):
    proc = generate("--prompt", "hi", "--temperature", "-1", models=tiny_pair["models_yaml"])
    assert proc.returncode == 2 and "temperature must be between 0 and 5" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = generate("--prompt", "hi", "--model", "nope", models=tiny_pair["models_yaml"])
    assert proc.returncode == 2 and "no model pair named 'nope'" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("proposer", ["none", "ngram"])
def test_generate_json_embedded_default(proposer):
    out = check_json(
        generate(
            "--prompt",
            "Write a Python function that adds two numbers.",
            "--proposer",
            proposer,
            "--max-new-tokens",
            "40",
        )
    )
    assert out["model"].startswith("SmolLM2-135M-Instruct") and out["text"].strip()
