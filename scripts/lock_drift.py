"""Print how the installed packages differ from a lock file.

`make test-latest` runs it to list what is newer than the lock; `make run` / `make test` run it with --strict after
installing, so a venv that does not hold exactly the locked versions stops the build (exit 1)."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path


def locked(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.lower().replace("_", "-")] = version
    return pins


def main(argv: list[str]) -> int:
    strict = "--strict" in argv
    lock = next(arg for arg in argv if not arg.startswith("--"))
    pins = locked(Path(lock))
    installed = {dist.metadata["Name"].lower().replace("_", "-"): dist.version for dist in metadata.distributions()}
    missing = sorted(name for name in pins if name not in installed)
    changed = sorted(
        (name, pins[name], installed[name]) for name in pins if name in installed and installed[name] != pins[name]
    )
    if strict:
        for name in missing:
            print(f"{lock}: {name}=={pins[name]} is not installed", file=sys.stderr)
        for name, want, have in changed:
            print(f"{lock}: {name} is {have}, the lock says {want}", file=sys.stderr)
        return 1 if missing or changed else 0
    print(f"versions that differ from {lock}: {len(changed)}" + ("" if changed else " (the lock is current)"))
    for name, old, new in changed:
        print(f"  {name}: {old} -> {new}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
