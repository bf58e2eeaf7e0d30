"""``python -m waste``: see waste.app.cli."""

import sys

from waste.app.cli import main

sys.exit(main())
