"""``python -m subagents``: the ``subagents`` command."""

import sys

from subagents._entry import main

sys.exit(main())
