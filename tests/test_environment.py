"""The environment (config.Environment): every LOCALSPEC_* variable is read in config.py only, switches and lists by
one rule each, and a malformed switch is a clear error where it is used, never elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localspec.config import ENVIRONMENT, ConfigError, Environment

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("word", ["1", "on", "TRUE", " yes "])
def test_every_switch_takes_one_set_of_words(word):
    off = {name: "off" for name in ("LOCALSPEC_Q4_KERNEL", "LOCALSPEC_LAYER_KERNEL", "LOCALSPEC_PACKED")}
    env = Environment.read(off | {"LOCALSPEC_ALLOW_DOWNLOAD": word, "LOCALSPEC_WRITE_SCREENSHOT": word})
    assert env.allow_download and env.write_screenshot
    assert not (env.q4_kernel or env.layer_kernel or env.packed)
    for other in ("0", "false", "No"):
        assert Environment.read({"LOCALSPEC_PACKED": other}).packed is False


def test_a_malformed_switch_is_a_clear_error_where_it_is_used_and_nowhere_else():
    env = Environment.read({"LOCALSPEC_PACKED": "sometimes", "LOCALSPEC_HOME": "/data", "LOCALSPEC_FORWARD": "x"})
    with pytest.raises(ConfigError, match="LOCALSPEC_PACKED='sometimes' is not a switch"):
        assert env.packed
    with pytest.raises(ConfigError, match="LOCALSPEC_FORWARD"):
        assert env.forward
    assert env.home == "/data" and env.q4_kernel is True


def test_lists_are_comma_separated_with_blanks_dropped():
    env = Environment.read({"LOCALSPEC_ALLOWED_HOSTS": " a.lan, ,b:8080 ,", "LOCALSPEC_CORS_ORIGINS": ""})
    assert env.allowed_hosts == ("a.lan", "b:8080") and env.cors_origins == ()


def test_no_module_but_config_reads_a_localspec_variable_and_each_is_documented():
    read = re.compile(r"environ(\.get)?\(?\[?[\"']LOCALSPEC_|getenv\([\"']LOCALSPEC_")
    readers = [
        path.relative_to(REPO).as_posix()
        for path in sorted((REPO / "localspec").rglob("*.py")) + sorted((REPO / "tests").rglob("*.py"))
        if read.search(path.read_text(encoding="utf-8"))
    ]
    assert readers == [], readers
    named = set(re.findall(r"LOCALSPEC_[A-Z0-9_]+", (REPO / "localspec" / "config.py").read_text(encoding="utf-8")))
    assert named <= set(ENVIRONMENT), named - set(ENVIRONMENT)
