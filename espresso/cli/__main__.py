"""``python -m espresso.cli``."""

import sys

from . import main

sys.exit(main())
