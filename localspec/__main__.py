"""`python -m localspec` runs the command line, as the `localspec` script does."""

import sys

from localspec.cli.main import main

sys.exit(main())
