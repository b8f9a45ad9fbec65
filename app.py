"""localspec chat window. Placeholder until the UI lands: `python app.py` checks the default model loads."""
import sys

from localspec.cli import main

if __name__ == "__main__":
    sys.exit(main(["generate", "--prompt", "Say hello in one short sentence.", "--max-new-tokens", "32"]))
