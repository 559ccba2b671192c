"""`python -m gr00t_train` = the `gr00t-train` command."""

import sys

from .cli import main

sys.exit(main())
