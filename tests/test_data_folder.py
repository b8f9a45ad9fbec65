"""A data folder (LOCALSPEC_HOME) that is a file or cannot be written: clear messages, and the app runs without
saving where it can (Gradio's temporary files, the store, the converted-GGUF cache)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture()
def home_is_a_file(tmp_path, monkeypatch):
    home = tmp_path / "not-a-folder"
    home.write_text("x")
    monkeypatch.setenv("LOCALSPEC_HOME", str(home))
    return home


def test_temporary_files_fall_back_with_a_message(home_is_a_file, monkeypatch, capsys):
    from localspec.ui import tempfiles

    monkeypatch.setattr(tempfiles, "_folder", None)
    folder = tempfiles.folder()
    try:
        assert folder.is_dir() and not folder.is_relative_to(home_is_a_file)
        (folder / "probe").write_text("ok")
        err = capsys.readouterr().err
        assert "cannot be written" in err and "LOCALSPEC_HOME" in err and str(folder) in err
    finally:
        tempfiles.remove()


def test_the_store_refuses_a_file_home_with_a_store_error(home_is_a_file):
    from localspec.store.db import ConversationStore, StoreError

    with pytest.raises(StoreError, match="cannot create the folder"):
        ConversationStore()


def test_the_app_runs_without_saving_when_the_store_cannot_open(home_is_a_file, capsys):
    from localspec.ui.serve import open_store, parse_args

    store, notice = open_store(parse_args([]))
    assert store is None and notice.startswith("Conversations will not be saved")


def test_the_probe_cleanup_never_raises_a_raw_os_error(tmp_path, monkeypatch):
    from localspec.store.db import ConversationStore

    path = tmp_path / "conversations.db"
    path.write_bytes(b"not a database, " * 512)  # a damaged file: the probe puts its -shm back as found
    real_unlink = Path.unlink

    def refusing_unlink(self, missing_ok=False):
        if self.name.endswith("-shm"):
            raise PermissionError(13, "Permission denied", str(self))
        return real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refusing_unlink)
    store = ConversationStore(path)  # a read-only folder refuses the unlink: the store still opens
    assert store.recovered_from is not None
    store.close()


def test_a_cache_folder_that_cannot_be_made_falls_back(home_is_a_file, capsys):
    from localspec.models.paths import cache_dir, writable_folder

    folder = writable_folder(cache_dir() / "gguf", "The converted GGUF model")
    assert folder.is_dir() and not folder.is_relative_to(home_is_a_file)
    assert writable_folder(cache_dir() / "gguf", "again") == folder  # one fallback per folder, one warning
    err = capsys.readouterr().err
    assert err.count("cannot be written") == 1 and "for this run only" in err
