"""The ``subagents`` command's entry point (``python -m subagents`` too).

The command's modules take a few tenths of a second to import; a Ctrl-C in that
time ends the command as one later does -- ``interrupted`` on stderr, exit 130
-- where it printed the traceback of whichever import it landed in.
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> int:
    """Import the command line, then run it (see :func:`subagents.actors._shell._cli.main`)."""
    try:
        from subagents.actors._shell._cli import main as run

        return run()  # which ends a Ctrl-C of its own commands' so too
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
