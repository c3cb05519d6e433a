"""The CLI's consoles and tables, readable in a terminal and in a log: when output is not a terminal, rich
would lay tables out for 80 columns and cut headers ("predi…"); a log gets LOG_WIDTH columns instead, and a
column is never narrower than the longest word of its header (headers wrap, they are never cut)."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

LOG_WIDTH = 160


def _console(stderr: bool = False) -> Console:
    probe = Console(stderr=stderr)
    return probe if probe.is_terminal else Console(stderr=stderr, width=LOG_WIDTH)


out = _console()
err = _console(stderr=True)


def table(title: str, columns, right=()) -> Table:
    """A table whose headers are never truncated; ``right``: the columns aligned right (numbers)."""
    t = Table(title=title)
    for c in columns:
        t.add_column(c, justify="right" if c in right else "left", min_width=max(len(w) for w in c.split()))
    return t
