"""``python -m espresso.train PLAN --data ...``: one rank of a training run (under torchrun or
``espresso launch``), the same as ``espresso train``."""

from __future__ import annotations

import sys

from .command import main

if __name__ == "__main__":
    sys.exit(main())
