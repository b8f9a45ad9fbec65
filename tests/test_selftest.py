"""`localspec selftest` and `localspec bench-sampler`: output structure and exit codes (never timings)."""

import json

import pytest

from localspec.cli.main import main


def _json_out(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_selftest_passes_on_the_tiny_pair(tiny_pair, capsys):
    args = ["selftest", "--json", "--models", str(tiny_pair["models_yaml"]), "--device", "cpu", "--exact", "off"]
    code = main(args)
    out = _json_out(capsys)
    assert code == 0 and out["passed"] is True, out["checks"]
    names = [c["name"] for c in out["checks"]]
    assert names[0].startswith("sampler chi-square") and "greedy losslessness" in names
    assert {c["status"] for c in out["checks"]} <= {"pass", "skip"}
    lossless = next(c for c in out["checks"] if c["name"] == "greedy losslessness")
    assert lossless["status"] == "pass" and "identical" in lossless["detail"]
    from localspec.verify.guarantee import guarantee_for

    stated = guarantee_for("float32", "none", "cpu", "fast")
    assert out["guarantee"] == stated.to_dict()  # the loaded path's guarantee, as guarantee.py states it
    assert stated.path in lossless["detail"] and f"greedy {stated.short}" in lossless["detail"]


def test_selftest_fails_with_a_wrong_sampler(monkeypatch, capsys):
    """A sampler that always accepts the draft breaks the target distribution: the chi-square check must fail."""
    import localspec.cli.selftest as selftest
    from localspec.verify import rejection_sample

    def always_accept(target_logits, draft_token_ids, draft_probs, sampling, draws):
        out = rejection_sample(target_logits, draft_token_ids, draft_probs, sampling, draws)
        k = draft_token_ids.shape[1]
        tokens = out.output_token_ids.clone()
        tokens[:, :k] = draft_token_ids
        return type(out)(
            tokens,
            out.num_accepted.clone().fill_(k),
            out.target_probs_of_drafts,
            out.draft_probs_of_drafts,
            out.target_prob_of_last,
        )

    monkeypatch.setattr(selftest, "rejection_sample", always_accept)
    code = main(["selftest", "--json", "--skip-model", "--device", "cpu"])
    out = _json_out(capsys)
    assert code == 1 and out["passed"] is False
    assert out["checks"][0]["status"] == "fail"


def test_selftest_reports_a_missing_model_as_a_failed_check(tmp_path, capsys):
    missing = tmp_path / "models.yaml"
    missing.write_text("- name: gone\n  target: {source: " + str(tmp_path / "nowhere") + "}\n")
    code = main(["selftest", "--models", str(missing), "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 1
    assert "greedy losslessness" in out and "FAIL" in out
    assert "guarantee (" not in out  # no model loaded, no guarantee claimed


def test_selftest_table(capsys):
    code = main(["selftest", "--skip-model", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0
    assert "sampler chi-square (torch reference)" in out and "PASS" in out and "SKIP" in out


@pytest.mark.parametrize("include_interpreter", [False, True])
def test_bench_sampler_structure(include_interpreter, capsys):
    from localspec.verify import triton_available

    interpreted = False
    if triton_available():
        from localspec.verify import triton_fused

        interpreted = triton_fused.INTERPRETED

    argv = [
        "bench-sampler",
        "--vocab",
        "300",
        "--k",
        "2",
        "--batch",
        "1",
        "2",
        "--mode",
        "both",
        "--repeats",
        "2",
        "--warmup",
        "0",
        "--device",
        "cpu",
        "--json",
    ]
    if include_interpreter:
        argv.append("--include-interpreter")
    assert main(argv) == 0
    out = _json_out(capsys)
    assert [(r["batch"], r["mode"]) for r in out["rows"]] == [
        (1, "greedy"),
        (1, "stochastic"),
        (2, "greedy"),
        (2, "stochastic"),
    ]
    assert all(r["vocab"] == 300 and r["k"] == 2 and r["torch_us"] > 0 for r in out["rows"])
    if include_interpreter and interpreted:
        assert out["fused"] == "interpreter" and "not a speed measurement" in out["note"]
        assert all(r["fused_us"] > 0 and r["speedup"] > 0 for r in out["rows"])
    else:
        assert out["fused"] == "not run" and out["note"]
        assert all(r["fused_us"] is None and r["speedup"] is None for r in out["rows"])


def test_bench_sampler_table(capsys):
    assert (
        main(
            [
                "bench-sampler",
                "--vocab",
                "200",
                "--k",
                "1",
                "--batch",
                "1",
                "--mode",
                "greedy",
                "--repeats",
                "1",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "torch µs" in out and "fused µs" in out and "note:" in out


def test_greedy_losslessness_check_catches_a_lossy_verifier(tiny_pair, monkeypatch, capsys):
    """A verifier that accepts every draft makes speculative output differ from plain decoding: the check fails."""
    import localspec.engine.loop as engine
    from localspec.verify import rejection_sample

    def always_accept(target_logits, draft_token_ids, draft_probs, sampling, draws):
        out = rejection_sample(target_logits, draft_token_ids, draft_probs, sampling, draws)
        k = draft_token_ids.shape[1]
        tokens = out.output_token_ids.clone()
        tokens[:, :k] = draft_token_ids
        tokens[:, k] = target_logits[:, k].argmax(-1)  # a bonus token after the (wrongly) accepted drafts
        return type(out)(
            tokens,
            out.num_accepted.clone().fill_(k),
            out.target_probs_of_drafts,
            out.draft_probs_of_drafts,
            out.target_prob_of_last,
        )

    monkeypatch.setattr(engine, "get_verifier", lambda name, device: ("lossy", always_accept))
    args = ["selftest", "--json", "--models", str(tiny_pair["models_yaml"]), "--device", "cpu", "--exact", "off"]
    code = main(args)
    out = _json_out(capsys)
    lossless = next(c for c in out["checks"] if c["name"] == "greedy losslessness")
    assert code == 1 and lossless["status"] == "fail" and "outputs differ at token" in lossless["detail"]
    assert "not below the cpu float32, fast forwards bound" in lossless["detail"]  # a real difference, no near-tie
