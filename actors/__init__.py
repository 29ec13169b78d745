"""subagents.actors (being built)."""

__all__: list[str] = []
