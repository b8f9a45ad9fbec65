"""`python app.py` opens the localspec chat window (options: `python app.py --help`; code: localspec/ui/serve.py)."""

import sys

from localspec.ui.serve import main

if __name__ == "__main__":
    sys.exit(main())
