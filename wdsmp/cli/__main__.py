"""``python -m wdsmp.cli``: the ``wdsmp`` command."""

import sys

from . import main

sys.exit(main())
