"""python -m mkb: the same as the mkb command."""

import sys

from mkb.cli import main

sys.exit(main())
