"""`python -m abbench ...` — the same command as the `abbench` console script."""

import sys

from abbench.cli import main

sys.exit(main())
