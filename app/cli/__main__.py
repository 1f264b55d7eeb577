"""`python -m app.cli`: the `planner` command."""

import sys

from app.cli import main

sys.exit(main())
