"""`localspec generate` whose output goes away (>&-, | head -c 1), and a models.yaml with a broken entry it was not
asked to use (a warning, then the answer, as in the app)."""

from __future__ import annotations

import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from localspec.config import ConfigError

REPO = Path(__file__).resolve().parents[1]
TYPO = "- name: typo\n  target: {source: some/model}\n  kk: 3\n"


def with_typo(tiny_pair, folder: Path) -> Path:
    path = folder / "models.yaml"
    text = Path(tiny_pair["models_yaml"]).read_text()
    root = Path(tiny_pair["root"])
    text = text.replace("source: tiny-target", f"source: {root / 'tiny-target'}")
    text = text.replace("source: tiny-draft", f"source: {root / 'tiny-draft'}")
    path.write_text(text + TYPO)
    return path


def test_resolve_pair_warns_about_a_broken_entry_and_answers_with_the_one_asked(tiny_pair, tmp_path, capsys):
    from localspec.cli.common import resolve_pair

    models = with_typo(tiny_pair, tmp_path)
    assert resolve_pair(Namespace(models=str(models), model="tiny", model_file=None)).name == "tiny"
    assert resolve_pair(Namespace(models=str(models), model=None, model_file=None)).name == "tiny"
    err = capsys.readouterr().err
    assert "warning: skipped" in err and "'typo'" in err and "kk" in err
    with pytest.raises(ConfigError, match="kk"):  # asked for by name: its own error
        resolve_pair(Namespace(models=str(models), model="typo", model_file=None))


def shell(command: str, tmp_path: Path) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), LOCALSPEC_HOME=str(tmp_path / "home"))
    err = tmp_path / "stderr.txt"
    proc = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command} 2>{err}"], env=env, cwd=REPO, timeout=600, capture_output=True
    )
    return proc.returncode, err.read_text(errors="replace")


def generate_command(models: Path, extra: str = "") -> str:
    return (
        f"{sys.executable} -m localspec generate --models {models} --model tiny --device cpu --prompt hello "
        f"--max-new-tokens 200 {extra}"
    )


@pytest.mark.slow
def test_output_that_goes_away_ends_quietly(tiny_pair, tmp_path):
    models = with_typo(tiny_pair, tmp_path)
    code, err = shell(generate_command(models) + " | head -c 1 >/dev/null", tmp_path)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert code in (0, 141), err  # 141: ended by the closed pipe, as `yes | head -c 1` is
    code, err = shell(generate_command(models) + " >&-", tmp_path)
    assert code == 0 and "Traceback" not in err, err
    assert "warning: skipped" in err  # the typo entry: a warning, and the answer came anyway
