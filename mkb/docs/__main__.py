"""python -m mkb.docs DSL OUT_DIR: one DSL's reference, generated in this process (docs build's child)."""

import sys

from mkb.docs.generate import main

sys.exit(main(sys.argv[1:]))
