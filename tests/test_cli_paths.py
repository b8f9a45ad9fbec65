"""Every path the CLI takes gives one line that says what is wrong with it, never a traceback (issue 46, case 7):
a symlink loop, a missing file, a folder, a FIFO, an unreadable file, for --model-file and --models."""

from __future__ import annotations

import os

import pytest

from localspec.cli.main import main


def loop(tmp_path):
    (tmp_path / "a.gguf").symlink_to(tmp_path / "b.gguf")
    (tmp_path / "b.gguf").symlink_to(tmp_path / "a.gguf")
    return tmp_path / "a.gguf"


def folder(tmp_path):
    (tmp_path / "models").mkdir()
    return tmp_path / "models"


def fifo(tmp_path):
    os.mkfifo(tmp_path / "pipe.gguf")
    return tmp_path / "pipe.gguf"


def unreadable(tmp_path):
    path = tmp_path / "locked.gguf"
    path.write_bytes(b"GGUF")
    path.chmod(0)
    return path


CASES = {
    "loop": (loop, "is a symlink loop"),
    "missing": (lambda tmp_path: tmp_path / "none.gguf", "does not exist"),
    "folder": (folder, "is a folder without config.json"),
    "fifo": (fifo, "is a FIFO (named pipe), not a model file"),
    "unreadable": (unreadable, "cannot be read: Permission denied"),
}


def one_line_error(argv, capsys) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "Traceback" not in captured.err
    return captured.err


@pytest.mark.parametrize("case", CASES)
def test_model_file_that_cannot_be_used_gives_one_line(case, tmp_path, capsys):
    if case == "unreadable" and os.geteuid() == 0:
        pytest.skip("root reads any file")
    make, expected = CASES[case]
    path = make(tmp_path)
    err = one_line_error(["generate", "--model-file", str(path), "--prompt", "hi", "--device", "cpu"], capsys)
    assert err.startswith(f"localspec: --model-file {path} ") and expected in err


@pytest.mark.parametrize("case", ["loop", "folder"])
def test_a_models_yaml_that_cannot_be_read_gives_one_line(case, tmp_path, capsys):
    path = CASES[case][0](tmp_path)
    err = one_line_error(["generate", "--models", str(path), "--prompt", "hi", "--device", "cpu"], capsys)
    assert f"model list {path} cannot be read" in err
