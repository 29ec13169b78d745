"""Defaults the command line and the demo share (no runtime imported here)."""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_DB"]

#: Where ``subagents demo`` keeps its tree unless ``--db`` says otherwise.
DEFAULT_DB: Final = "./subagents-demo.db"
