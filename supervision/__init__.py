"""subagents.supervision (being built)."""

__all__: list[str] = []
