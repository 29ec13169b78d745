"""A plain-text tree outline, drawn as ``rich.tree.Tree`` draws one.

``subagents tree`` prints thousands of trees; rich lays each out as renderables
(measure, wrap, style, segments), which cost more than listing them. An
:class:`Outline` only joins guide strings, with rich's glyphs, so the output is
the same text at a fraction of the cost.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["Outline"]

_FORK, _LAST, _PIPE, _SPACE = "├── ", "└── ", "│   ", "    "


class Outline:
    """A node: its one-line ``text`` and its children, in the order added."""

    __slots__ = ("children", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.children: list[Outline] = []

    def add(self, text: str) -> Outline:
        """A new child below this node (returned)."""
        child = Outline(text)
        self.children.append(child)
        return child

    def lines(self) -> Iterator[str]:
        """The outline, one line per node, children below their parent."""
        yield self.text
        # (node, prefix of its children's lines), depth-first without recursion.
        stack: list[tuple[Outline, str, bool]] = [
            (c, "", i == len(self.children) - 1) for i, c in enumerate(self.children)
        ][::-1]
        while stack:
            node, prefix, last = stack.pop()
            yield prefix + (_LAST if last else _FORK) + node.text
            below = prefix + (_SPACE if last else _PIPE)
            kids = node.children
            stack.extend((c, below, i == len(kids) - 1) for i, c in reversed(list(enumerate(kids))))

    def render(self) -> str:
        """The outline as text (lines joined by newlines, no trailing newline)."""
        return "\n".join(self.lines())
