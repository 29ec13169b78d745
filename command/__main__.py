"""``python -m subagents``: the ``subagents`` command."""

import sys

from subagents.actors._shell._cli import main

sys.exit(main())
