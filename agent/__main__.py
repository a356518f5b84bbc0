"""``python -m <agent package> --node NAME``: run the node agent."""

import sys

from .main import main

sys.exit(main())
