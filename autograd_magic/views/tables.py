"""What every view shows: sentences and tables of strings, and their plain-text form.

The text report, the static HTML and the panel lower the same `Sentence`s and `Table`s, so they
always agree.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_TABLE_ROWS = 500  # the widget's tables
TEXT_TABLE_ROWS = 30  # the text report stays a screen or two


@dataclass(frozen=True)
class Sentence:
    """One plain sentence for the reader; `kind` is error, finding, blindspot or note."""

    text: str
    line: int | None
    kind: str = "finding"


@dataclass(frozen=True)
class Table:
    """Rows of strings under `headers`; `note` says what was left out, never cut silently."""

    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""


def cut_note(count: int, limit: int = MAX_TABLE_ROWS) -> str:
    return f"Showing the first {limit:,} of {count:,} rows." if count > limit else ""


def capped(table: Table, limit: int) -> Table:
    """`table` cut to `limit` rows, its note saying how many rows there were."""
    if len(table.rows) <= limit:
        return table
    note = f"Showing {limit} of {len(table.rows):,} rows. {table.note}".strip()
    return Table(table.title, table.headers, table.rows[:limit], note)


def table_text(table: Table) -> str:
    """A column-aligned plain-text table with its title and note."""
    if not table.rows:
        return f"{table.title}: none"
    widths = [len(h) for h in table.headers]
    for row in table.rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = [f"{table.title}:"]
    for row in (table.headers, *table.rows):
        lines.append(
            "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        )
    if table.note:
        lines.append(f"  ({table.note})")
    return "\n".join(lines)
