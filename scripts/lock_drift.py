"""Print how the installed packages differ from a lock file (`make test-latest` runs it before the fast suite)."""
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


def main(lock: str) -> int:
    pins = locked(Path(lock))
    installed = {dist.metadata["Name"].lower().replace("_", "-"): dist.version for dist in metadata.distributions()}
    changed = sorted((name, pins[name], installed[name]) for name in pins
                     if name in installed and installed[name] != pins[name])
    print(f"versions newer than {lock}: {len(changed)}" + ("" if changed else " (the lock is current)"))
    for name, old, new in changed:
        print(f"  {name}: {old} -> {new}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
