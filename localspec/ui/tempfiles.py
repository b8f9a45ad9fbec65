"""Gradio's temporary files (uploads, the copies it serves for downloads, exports) live in an owner-only folder
under the app's data folder, `$LOCALSPEC_HOME/tmp/gradio-<pid>` (0700), removed when the process exits. Folders
left by a process that was killed are removed by the next start. Imports nothing from Gradio: `use()` must run
before Gradio is imported, because Gradio reads GRADIO_TEMP_DIR at import time. When the data folder is a file or
read-only, a private folder in the system's temporary folder is used instead (with a warning)."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

PREFIX = "gradio-"
_folder: Path | None = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def folder() -> Path:
    """This process's temporary folder (created, owner-only, removed at exit)."""
    global _folder
    if _folder is None:
        from localspec.models.paths import folder_problem, home

        try:
            root = _private_dir(home() / "tmp")
            for old in root.glob(PREFIX + "*"):  # left by a killed process
                pid = old.name[len(PREFIX) :]
                if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                    shutil.rmtree(old, ignore_errors=True)
            _folder = _private_dir(root / f"{PREFIX}{os.getpid()}")
        except OSError as exc:  # the data folder is a file or read-only: the system's temporary folder instead
            _folder = Path(tempfile.mkdtemp(prefix=f"localspec-{PREFIX}"))
            print(f"localspec: {folder_problem(exc)}. Temporary files go to {_folder}.", file=sys.stderr, flush=True)
        atexit.register(remove)
    return _folder


def remove() -> None:
    if _folder is not None:
        shutil.rmtree(_folder, ignore_errors=True)


def use() -> Path:
    """Point Gradio's temporary files at folder()."""
    path = folder()
    os.environ["GRADIO_TEMP_DIR"] = str(path)
    return path
