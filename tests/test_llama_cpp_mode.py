"""The llama.cpp bench modes run llama.cpp's own C++ (llama-server, llama-bench). No build is needed here: stand-in
executables (small Python scripts) speak llama-server's /health and /completion protocol and print llama-bench's
JSON, and record what they were started with and asked."""

from __future__ import annotations

import json
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from localspec.bench import llama_bin, llama_cpp
from localspec.bench.llama_bench import bench_command, parse
from localspec.bench.llama_server import (
    CONTEXT_TOKENS,
    LlamaServerError,
    Speculation,
    completion_body,
    server_command,
)
from localspec.bench.modes import Mode, RunResult, available_modes, run_mode
from localspec.config import ConfigError

ANSWER = [7, 8, 2, 9]  # the stand-in server's answer to any prompt; 2 is an end-of-generation token

STAND_IN_SERVER = """
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

args = sys.argv[1:]
record = os.environ["STAND_IN_RECORD"]
open("llama.log", "a").close()  # as ik_llama.cpp's server does, in its working folder
with open(record, "a") as out:
    out.write(json.dumps({"argv": args}) + "\\n")
if os.environ.get("STAND_IN_FAIL"):
    print("llama_model_load: error loading model: tensor 'x' has wrong shape", file=sys.stderr, flush=True)
    sys.exit(1)
health = {"calls": 0}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *_):
        pass

    def reply(self, code, data):
        payload = json.dumps(data).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):
        health["calls"] += 1  # loading (503) on the first call, as llama-server is while it reads the file
        self.reply(503 if health["calls"] == 1 else 200, {"status": "ok"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(record, "a") as out:
            out.write(json.dumps({"path": self.path, "body": body}) + "\\n")
        answer = ANSWER[: body["n_predict"]]
        if 2 in answer and not body.get("ignore_eos"):
            answer = answer[: answer.index(2) + 1]
        timings = {"prompt_n": len(body["prompt"]), "prompt_ms": 20.0, "predicted_n": len(answer),
                   "predicted_ms": 40.0, "prompt_per_second": 50.0, "predicted_per_second": 75.0}
        if "--spec-type" in args:
            timings.update(draft_n=4, draft_n_accepted=3)
        reply = {"tokens": answer, "stop_type": "eos" if answer[-1:] == [2] else "limit", "timings": timings}
        if os.environ.get("STAND_IN_NO_TOKENS") or TEXT_ONLY:  # a server that ignores return_tokens
            del reply["tokens"]
        if TEXT_ONLY:  # ik_llama.cpp's answer: its text, and whether it stopped at the end token
            # its text tokenized again merges two of its tokens: "w78"
            reply = {"content": "w" + "".join(str(t) for t in answer if t != 2), "stopped_eos": answer[-1:] == [2],
                     "timings": timings}
        self.reply(200, reply)


HTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), Handler).serve_forever()
"""

BENCH_JSON = [
    {"n_prompt": 512, "n_gen": 0, "avg_ts": 320.0, "stddev_ts": 3.0, "n_threads": 2, "build_commit": "abc1234"},
    {"n_prompt": 0, "n_gen": 128, "avg_ts": 120.0, "stddev_ts": 1.5, "n_threads": 2, "build_commit": "abc1234"},
]

STAND_IN_BENCH = f"""
import json, os, sys
with open(os.environ["STAND_IN_RECORD"], "a") as out:
    out.write(json.dumps({{"bench_argv": sys.argv[1:]}}) + "\\n")
print(json.dumps({BENCH_JSON!r}))
"""


def _executable(folder: Path, name: str, body: str, text_only: bool = False) -> None:
    path = folder / name
    text = f"#!{sys.executable}\nANSWER = {ANSWER!r}\nTEXT_ONLY = {text_only!r}\n" + textwrap.dedent(body)
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    """A bin folder with a stand-in llama-server and llama-bench, where the bench looks; returns the record file
    (one JSON line per start, request and llama-bench run)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    _executable(folder, "llama-server", STAND_IN_SERVER)
    _executable(folder, "llama-bench", STAND_IN_BENCH)
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("STAND_IN_RECORD", str(record))
    # llama.cpp's folder; the other peers (ik_llama.cpp) are not built
    monkeypatch.setattr(
        llama_bin,
        "bin_dir",
        lambda peer=llama_bin.LLAMA_CPP: folder if peer.name == "llama.cpp" else tmp_path / peer.name,
    )
    yield record
    llama_cpp.stop_servers()


def _records(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def _gguf(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_bytes(b"GGUF" + bytes(60))
    return path


def _pair(target: str, draft: str | None = None, k: int = 4):
    return types.SimpleNamespace(
        name="p",
        target=types.SimpleNamespace(source=target, dtype="float32"),
        draft=types.SimpleNamespace(source=draft) if draft is not None else None,
        k=k,
        ngram=None,
        head=None,
        proposers=("none",),
    )


def _session(pair):
    loaded = types.SimpleNamespace(spec=pair, draft=None, dtype=None, quant="gguf")
    engine = types.SimpleNamespace(stop_token_ids={2}, target=types.SimpleNamespace(supports_tree=False))
    return types.SimpleNamespace(loaded=loaded, engine=engine)


# -- the command lines and the request ----------------------------------------------------------------------------


def test_the_server_command_lines_for_plain_lookup_and_draft_model_speculation(tmp_path):
    binary, model, draft = Path("/b/llama-server"), Path("/m/t.gguf"), Path("/m/d.gguf")
    plain = server_command(binary, model, 3, 4321)
    assert plain == [
        "/b/llama-server",
        "--model",
        "/m/t.gguf",
        "--threads",
        "3",
        "--threads-batch",
        "3",
        "--ctx-size",
        str(CONTEXT_TOKENS),
        "--parallel",
        "1",
        "--host",
        "127.0.0.1",
        "--port",
        "4321",
        "--no-webui",
    ]
    lookup = server_command(binary, model, 3, 4321, Speculation("lookup", 4))
    assert lookup[len(plain) :] == [
        "--spec-type",
        "ngram-simple",
        "--spec-ngram-simple-size-n",
        "2",
        "--spec-ngram-simple-size-m",
        "4",
    ]
    drafted = server_command(binary, model, 3, 4321, Speculation("draft", 6, draft))
    assert drafted[len(plain) :] == [
        "--spec-type",
        "draft-simple",
        "--spec-draft-model",
        "/m/d.gguf",
        "--spec-draft-n-max",
        "6",
        "--spec-draft-threads",
        "3",
        "--spec-draft-threads-batch",
        "3",
    ]
    with pytest.raises(ConfigError, match="GGUF draft model"):
        Speculation("draft", 6).args(3)


def test_the_draft_mode_drafts_the_pairs_k_with_its_gguf_draft(tmp_path):
    target, draft = _gguf(tmp_path, "t.gguf"), _gguf(tmp_path, "d.gguf")
    pair = _pair(str(target), str(draft), k=5)
    assert llama_cpp.speculation(pair, "llama.cpp-draft") == Speculation("draft", 5, draft)
    assert llama_cpp.speculation(pair, "llama.cpp-lookup") == Speculation("lookup", 4)
    assert llama_cpp.speculation(pair, "llama.cpp") is None
    with pytest.raises(ConfigError, match="GGUF draft"):
        llama_cpp.speculation(_pair(str(target), str(tmp_path)), "llama.cpp-draft")  # a folder: not GGUF


def test_the_request_is_greedy_on_the_same_ids_with_nothing_reused():
    body = completion_body([5, 6, 7], 64)
    assert body["prompt"] == [5, 6, 7] and body["n_predict"] == 64
    assert body["temperature"] == 0.0 and body["top_k"] == 1 and body["repeat_penalty"] == 1.0
    assert body["cache_prompt"] is False  # the prefill is timed on every answer
    assert body["ignore_eos"] is False and body["return_tokens"] is True and body["stream"] is False


def test_llama_bench_command_and_its_json():
    command = bench_command(Path("/b/llama-bench"), Path("/m/t.gguf"), 2)
    assert command == ["/b/llama-bench", "-m", "/m/t.gguf", "-t", "2", "-p", "512", "-n", "128", "-o", "json"]
    line = parse(command, json.dumps(BENCH_JSON))
    assert (line.pp.tokens_per_s, line.tg.tokens_per_s, line.tg.stddev) == (320.0, 120.0, 1.5)
    assert line.threads == 2 and line.build_commit == "abc1234"
    with pytest.raises(ConfigError, match="n_gen=128"):
        parse(command, json.dumps(BENCH_JSON[:1]))
    with pytest.raises(ConfigError, match="no JSON"):
        parse(command, "error: failed to load model")


# -- which modes can run -------------------------------------------------------------------------------------------


def test_missing_binaries_say_how_to_build_them(tmp_path, monkeypatch):
    monkeypatch.setattr(llama_bin, "bin_dir", lambda *_: tmp_path / "nothing-here")
    target = _gguf(tmp_path, "t.gguf")
    why = available_modes(_session(_pair(str(target))))
    for mode in llama_cpp.LLAMA_MODES:
        build = "make setup-bench-ik" if mode == "ik_llama.cpp" else "make setup-bench-llama"
        assert build in why[mode] and "llama-server" in why[mode]
    with pytest.raises(ConfigError, match="make setup-bench-llama"):
        llama_bin.binary("llama-server")


def test_the_modes_say_why_they_cannot_run(stand_ins, tmp_path):
    target, draft = _gguf(tmp_path, "t.gguf"), _gguf(tmp_path, "d.gguf")
    assert set(available_modes(_session(_pair("some/model"))).values()) >= {"the target is not a GGUF file"}
    why = available_modes(_session(_pair(str(target))))
    assert why["llama.cpp"] is None and why["llama.cpp-lookup"] is None
    assert why["llama.cpp-draft"] == "pair 'p' has no draft model"
    why = available_modes(_session(_pair(str(target), str(tmp_path))))
    assert "is not a GGUF file" in why["llama.cpp-draft"]
    why = available_modes(_session(_pair(str(target), str(draft))))
    assert why["llama.cpp-draft"] is None


def test_the_cpu_tag_names_the_machine_and_changes_with_the_cpu_flags(monkeypatch):
    from localspec.runtime import library

    monkeypatch.setattr(library, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c", "sse2"}))
    avx2 = llama_bin.cpu_tag()
    monkeypatch.setattr(library, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c", "sse2", "avx_vnni"}))
    assert "-avx2-" in avx2 and llama_bin.cpu_tag() != avx2  # a native build is not shared across CPUs
    assert llama_bin.LLAMA_CPP_PYTHON in str(llama_bin.bin_dir())
    zen4 = {"avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni"}  # /proc/cpuinfo's spelling
    monkeypatch.setattr(library, "cpu_flags", lambda: frozenset(zen4))
    assert "-avx512bf16-" in llama_bin.cpu_tag()


# -- the server's life -------------------------------------------------------------------------------------------------


def test_a_mode_answers_through_its_server_which_stops_with_the_bench(stand_ins, tmp_path):
    target = _gguf(tmp_path, "t.gguf")
    session = _session(_pair(str(target)))
    plain = run_mode(session, Mode("llama.cpp"), [1, 2, 3], 8)
    again = run_mode(session, Mode("llama.cpp"), [4, 5], 2)
    lookup = run_mode(session, Mode("llama.cpp-lookup"), [1, 2, 3], 8)
    assert plain.token_ids == [7, 8, 2]  # up to and with the end-of-generation token, as our modes stop
    assert again.token_ids == [7, 8]  # max new tokens
    assert plain.seconds > 0 and plain.stats is None
    assert plain.peer_timings["predicted_per_second"] == 75.0 and lookup.peer_timings["draft_n_accepted"] == 3
    records = _records(stand_ins)
    starts = [r["argv"] for r in records if "argv" in r]
    assert len(starts) == 2  # one server per speculation, reused across answers
    threads = str(torch.get_num_threads())
    assert starts[0][starts[0].index("--threads") + 1] == threads and str(target) in starts[0]
    assert "--spec-type" not in starts[0] and "ngram-simple" in starts[1]
    bodies = [r["body"] for r in records if "body" in r]
    assert [b["prompt"] for b in bodies] == [[1, 2, 3], [4, 5], [1, 2, 3]]
    assert all(r["path"] == "/completion" for r in records if "body" in r)
    processes = [server.process for server in llama_cpp._SERVERS.values()]
    logs = [server.log_path for server in llama_cpp._SERVERS.values()]
    llama_cpp.stop_servers()
    assert all(p.poll() is not None for p in processes) and not any(log.exists() for log in logs)


def test_a_server_that_cannot_start_shows_the_end_of_its_log(stand_ins, tmp_path, monkeypatch):
    monkeypatch.setenv("STAND_IN_FAIL", "1")
    target = _gguf(tmp_path, "t.gguf")
    with pytest.raises(LlamaServerError, match="(?s)exited with code 1 before it was ready.*wrong shape"):
        run_mode(_session(_pair(str(target))), Mode("llama.cpp"), [1], 4)
    assert not llama_cpp._SERVERS


def test_an_answer_without_token_ids_is_an_error_not_an_empty_answer(stand_ins, tmp_path, monkeypatch):
    monkeypatch.setenv("STAND_IN_NO_TOKENS", "1")
    with pytest.raises(LlamaServerError, match="without token ids"):
        run_mode(_session(_pair(str(_gguf(tmp_path, "t.gguf")))), Mode("llama.cpp"), [1], 4)


def test_the_bench_stops_its_servers_on_ctrl_c_and_reports_llama_bench(stand_ins, tmp_path, monkeypatch):
    from localspec.bench import runner
    from localspec.bench.prompts import BenchPrompt

    target = _gguf(tmp_path, "t.gguf")
    session = _session(_pair(str(target)))
    session.prompt_ids = lambda messages, max_new_tokens: ([1, 2], None)
    session.engine.controllers = {}
    started = []

    def interrupted(session, mode, prompt_ids, max_new_tokens):
        started.append(llama_cpp.server_for(target, 1, None).process)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_mode", interrupted)
    prompt = BenchPrompt("chat/0", "chat", ({"role": "user", "content": "hi"},))
    with pytest.raises(KeyboardInterrupt):
        runner.run_bench(session, [prompt], [Mode("llama.cpp")], 8, progress=False, measure_rows=False)
    assert started and started[0].poll() is not None and not llama_cpp._SERVERS
    bench_runs = [r["bench_argv"] for r in _records(stand_ins) if "bench_argv" in r]
    assert bench_runs == [["-m", str(target), "-t", str(torch.get_num_threads())] + "-p 512 -n 128 -o json".split()]


def test_each_built_peer_runs_its_own_llama_bench_and_one_not_built_says_how_to_build_it(stand_ins, tmp_path):
    pair = _pair(str(_gguf(tmp_path, "t.gguf")))
    assert "make setup-bench-ik" in llama_cpp.peer_bench_lines(pair, 2)["ik_llama.cpp"]["error"]
    ik = tmp_path / "ik_llama.cpp"
    ik.mkdir()
    _executable(ik, "llama-bench", STAND_IN_BENCH.replace("abc1234", "ik12345"))
    lines = llama_cpp.peer_bench_lines(pair, 2)
    assert set(lines) == {"ik_llama.cpp"} and lines["ik_llama.cpp"]["build_commit"] == "ik12345"
    assert lines["ik_llama.cpp"]["command"][0] == str(ik / "llama-bench")
    assert lines["ik_llama.cpp"]["pp"]["tokens_per_s"] == 320.0


def test_llama_bench_failing_leaves_the_rest_of_the_report(tmp_path, monkeypatch):
    monkeypatch.setattr(llama_bin, "bin_dir", lambda *_: tmp_path)
    line = llama_cpp.llama_bench_line(_pair(str(_gguf(tmp_path, "t.gguf"))), 2)
    assert "make setup-bench-llama" in line["error"]


# -- the report ------------------------------------------------------------------------------------------------------


def test_the_report_puts_llama_bench_beside_every_mode():
    from localspec.bench.prompts import BenchPrompt
    from localspec.bench.report import summarize, to_json, to_markdown
    from localspec.bench.runner import BenchRun, PromptRecord

    modes = [Mode("none"), Mode("llama.cpp"), Mode("llama.cpp-lookup")]
    records = []
    for index in range(2):
        record = PromptRecord(BenchPrompt(f"chat/{index}", "chat", ({"role": "user", "content": "x"},)), [1, 2])
        timings = {"prompt_n": 10, "prompt_ms": 50.0, "predicted_n": 100, "predicted_ms": 1000.0}
        record.results = {
            "none": RunResult(list(range(100)), 1.0, 1.0),
            "llama.cpp": RunResult(list(range(100)), 0.9, 1.8, peer_timings=timings),
            "llama.cpp-lookup": RunResult(
                list(range(100)), 0.8, 1.6, peer_timings={**timings, "draft_n": 40, "draft_n_accepted": 10}
            ),
        }
        records.append(record)
    bench = {
        "command": ["/x/llama-bench", "-m", "t.gguf"],
        "pp": {"tokens_per_s": 320.0, "stddev": 3.0},
        "tg": {"tokens_per_s": 125.0, "stddev": 1.0},
        "threads": 2,
        "build_commit": "abc1234",
        "cpu_info": "cpu",
        "flash_attn": 0,
    }
    machine = {
        "cpu_count": 2,
        "processor": "x",
        "torch": "t",
        "torch_threads": 2,
        "load_before": {"load_1m": 1.0},
        "load_after": {"load_1m": 1.0},
        "load_1m_during": {"min": 1.0, "max": 1.0, "mean": 1.0},
        "verify_ms": {"1": 10.0},
        "llama_bench": bench,
        "peer_benches": {
            "ik_llama.cpp": {
                **bench,
                "pp": {"tokens_per_s": 640.0, "stddev": 5.0},
                "tg": {"tokens_per_s": 150.0, "stddev": 1.0},
                "build_commit": "ik12345",
            }
        },
        "peer_server_args": {"ik_llama.cpp": ["-ub", "31"]},
    }
    run = BenchRun("fake", modes, records, 100, [], machine)
    summary = summarize(run)
    own = summary["rows"]["llama.cpp-lookup"]["all"]["llama_timings"]
    assert own["prompt_per_second"] == pytest.approx(200.0) and own["predicted_per_second"] == pytest.approx(100.0)
    assert summary["rows"]["llama.cpp-lookup"]["all"]["acceptance_rate"] == pytest.approx(0.25)
    check = summary["llama_bench"]
    assert check["over_tg"]["llama.cpp"]["all"] == pytest.approx((200 / 1.8) / 125.0)
    assert check["over_tg"]["none"]["chat"] == pytest.approx(100.0 / 125.0)
    assert check["own_over_tg"]["llama.cpp"] == pytest.approx(100.0 / 125.0)
    assert check["our_forward_over_tg"] == pytest.approx(100.0 / 125.0)
    data = to_json(run, summary)
    assert data["prompts"][0]["results"]["llama.cpp"]["llama_timings"] == records[0].results["llama.cpp"].peer_timings
    text = to_markdown(data)
    assert "pp512 320.0 ± 3.0 t/s, tg128 125.0 ± 1.0 t/s" in text
    assert "| ik_llama.cpp | ik12345 | 640.0 | 150.0 | 2.00× | 1.20× |" in text
    assert "options added (`--peer-args`): ik_llama.cpp: `-ub 31`." in text
    # reading the prompt: llama.cpp's 10 prompt tokens in 50 ms, its first token one 10 ms decode step later
    assert summary["rows"]["llama.cpp"]["all"]["prefill"] == pytest.approx(
        {"prefill_tokens_per_s": 200.0, "mean_ttft_s": 0.06}
    )
    assert "prefill" not in summary["rows"]["none"]["all"]  # no engine stats in this stand-in run: nothing claimed
    assert "| llama.cpp | 200.0 | 0.060 |" in text
    assert "llama-bench pp512 on the same file (t/s): llama.cpp 320.0, ik_llama.cpp 640.0." in text
    assert "| llama.cpp | abc1234 | 320.0 | 125.0 | 1.00× | 1.00× |" in text
    assert "| llama.cpp-lookup | 1.00× | 1.00× | 200.0 | 100.0 | 0.80× | 25% |" in text
    assert check["shortest"] == "chat" and check["shortest_prompt_tokens"] == pytest.approx(10.0)
    assert "weighs least (chat: 10 prompt tokens, 100 answer tokens on average): 0.89 (within 10% of it: no)" in text


def test_a_tree_without_its_build_info_script_gets_one_that_fills_the_template(tmp_path):
    """ik-llama-cpp-python's sdist leaves out common/cmake/build-info-gen-cpp.cmake, which its build runs to write
    common/build-info.cpp: the build script writes one that fills the template with the package and version."""
    import importlib.util
    import shutil
    import subprocess

    spec = importlib.util.spec_from_file_location(
        "build_llama_cpp", Path(__file__).parents[1] / "scripts/build_llama_cpp.py"
    )
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    common = tmp_path / "common"
    common.mkdir()
    (common / "build-info.cpp.in").write_text('int N = @BUILD_NUMBER@;\nchar const *C = "@BUILD_COMMIT@";\n')
    build.fill_build_info(llama_bin.IK_LLAMA, tmp_path)
    script = common / "cmake" / "build-info-gen-cpp.cmake"
    assert 'set(BUILD_COMMIT "ik-llama-cpp-python-0.1.5")' in script.read_text()
    script.write_text(script.read_text() + "# kept\n")
    build.fill_build_info(llama_bin.IK_LLAMA, tmp_path)  # a tree that has the script keeps its own
    assert script.read_text().endswith("# kept\n")
    if shutil.which("cmake") is None:
        pytest.skip("no cmake here to run the script")
    subprocess.run(["cmake", "-P", str(script)], check=True, capture_output=True)
    assert (common / "build-info.cpp").read_text() == 'int N = 0;\nchar const *C = "ik-llama-cpp-python-0.1.5";\n'


def test_our_prefill_rate_and_time_to_first_token_come_from_the_engines_stats():
    from localspec.bench.prefill_report import prefill_figures

    def answer(prefill_s, first_token_s):
        return RunResult([1], 1.0, 1.0, stats=types.SimpleNamespace(prefill_s=prefill_s, first_token_s=first_token_s))

    figures = prefill_figures([answer(0.5, 0.6), answer(1.5, 1.8)], [300, 700])
    assert figures == pytest.approx({"prefill_tokens_per_s": 500.0, "mean_ttft_s": 1.2})
    assert prefill_figures([RunResult([1], 1.0, 1.0)], [5]) is None  # transformers' modes say nothing of it


# -- ik_llama.cpp's server as a mode --------------------------------------------------------------------------------


class _WordTokenizer:
    """w78 → [78]: the stand-in ik server's text read back."""

    eos_token_id = 2

    def encode(self, text, add_special_tokens=False):
        return [int(word[1:]) for word in text.split()]


def test_the_ik_mode_runs_ik_llama_cpps_own_server_and_counts_its_text(stand_ins, tmp_path, monkeypatch):
    here = tmp_path / "here"  # the bench's working folder: nothing of the servers' lands in it
    here.mkdir()
    monkeypatch.chdir(here)
    ik = tmp_path / "ik_llama.cpp"  # where the stand_ins fixture says ik_llama.cpp's binaries are
    ik.mkdir()
    target = _gguf(tmp_path, "t.gguf")
    session = _session(_pair(str(target)))
    session.tokenizer = _WordTokenizer()
    assert "make setup-bench-ik" in available_modes(session)["ik_llama.cpp"]
    _executable(ik, "llama-server", STAND_IN_SERVER, text_only=True)
    _executable(ik, "llama-bench", STAND_IN_BENCH)
    assert available_modes(session)["ik_llama.cpp"] is None
    llama_cpp.set_peer_args({"ik_llama.cpp": ("-ub", "31")})
    try:
        answer = run_mode(session, Mode("ik_llama.cpp"), [1, 2, 3], 8)
        short = run_mode(session, Mode("ik_llama.cpp"), [4], 2)
        plain = run_mode(session, Mode("llama.cpp"), [1, 2, 3], 8)
    finally:
        llama_cpp.set_peer_args({})
    assert answer.token_ids == [78, 2]  # its text tokenized again, and the end token it stopped at
    assert short.token_ids == [78]  # stopped by max new tokens: no end token
    assert (answer.new_tokens, short.new_tokens) == (3, 2)  # counted as the peer generated them
    assert plain.token_ids == [7, 8, 2] and plain.new_tokens == 3
    starts = [r["argv"] for r in _records(stand_ins) if "argv" in r]
    ik_start, llama_start = starts
    assert ik_start[-4:] == ["--webui", "none", "-ub", "31"] and "--no-webui" not in ik_start
    assert llama_start[-1] == "--no-webui" and "-ub" not in llama_start  # the extra options are ik's only
    assert llama_cpp.peer_of("ik_llama.cpp") is llama_bin.IK_LLAMA
    folders = [server.workdir for server in llama_cpp._SERVERS.values()]
    assert all((folder / "llama.log").exists() for folder in folders)  # each wrote its log file in its own folder
    llama_cpp.stop_servers()
    assert not any(folder.exists() for folder in folders) and not list(here.iterdir())


def test_peer_args_name_a_known_peer():
    from localspec.cli.bench import _peer_args

    assert _peer_args(["ik_llama.cpp=-ub 31", "ik_llama.cpp=--no-mmap"]) == {"ik_llama.cpp": ("-ub", "31", "--no-mmap")}
    with pytest.raises(ConfigError, match="PEER=ARGS"):
        _peer_args(["-ub 31"])
    with pytest.raises(ConfigError, match="no peer named ik"):
        llama_cpp.set_peer_args({"ik": ("-ub", "31")})
