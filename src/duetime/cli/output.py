"""How the commands show things: results on stdout (tables whose cells are shown safely,
times in the zone asked for, a task's status as JSON), errors and remarks on stderr."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, tzinfo
from typing import Any, NoReturn

import click
from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.padding import Padding
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column
from rich.table import Table as RichTable
from rich.text import Text as RichText

from duetime import times
from duetime.client import FinishedAttempt, TaskStatus
from duetime.states import HistoryOutcome

#: The widest an id column is made to keep its ids on one line: a generated id (12
#: characters), or a cron tick's ("cron:<name>:<ms>") of a name of up to 25, with some
#: room left for the other columns in an 80-column terminal.
WHOLE_WIDTH = 44
#: How the default handler (task name "") is shown, and may be named to --task.
DEFAULT_HANDLER_SHOWN = "(default)"


class Table(RichTable):
    """A rich table that reads well in 80 columns, whose cells are shown safely: an id or
    name read from Redis that is not UTF-8 (written by hand) is escaped, not a crash, and
    never taken as markup.

    The cells of the columns named in ``whole`` (ids: they are copied into other
    commands) are never cut: their column is as wide as its longest cell (up to
    WHOLE_WIDTH), rich takes the room from the others, and a longer id is folded onto
    more lines, whole. The cells of the columns named in
    ``one_line`` stay on one line, cut with an ellipsis when space is short (names, error
    text); a ``no_wrap`` column is never narrowed (times).

    The columns named in ``fold`` (in the order they give way) leave a table too wide for
    the terminal, one by one, until the rest fits: each row's folded cells are then
    written, after their headings, on an indented line of their own under the row,
    wrapped, never cut. So a narrow terminal still shows the column that answers the
    listing's question (a dead task's error, an attempt's outcome), rather than losing
    it to the room the ids take.
    """

    def __init__(
        self,
        *headers: str | Column,
        one_line: Sequence[str] = (),
        whole: Sequence[str] = ("id",),
        fold: Sequence[str] = (),
        **options: Any,
    ) -> None:
        options.setdefault("box", box.SIMPLE_HEAD)  # no side borders: room for the text
        options.setdefault("show_edge", False)
        options.setdefault("pad_edge", False)
        options.setdefault("collapse_padding", True)
        self.options = options
        super().__init__(*headers, **options)
        self.one_line = {i for i, c in enumerate(self.columns) if c.header in one_line}
        self.whole = {i for i, c in enumerate(self.columns) if c.header in whole}
        headers_shown = [c.header for c in self.columns]
        self.fold = [headers_shown.index(name) for name in fold]
        self.cells: list[list[RichText]] = []  # as shown, for a folded rendering

    def add_row(self, *cells: Any, **options: Any) -> None:
        shown_cells = []
        for index, cell in enumerate(cells):
            text = RichText(shown(str(cell)))
            if index in self.whole:
                text.overflow = "fold"
                column = self.columns[index]
                width = min(text.cell_len, WHOLE_WIDTH)
                column.min_width = max(column.min_width or 0, width)
            elif index in self.one_line:
                text.no_wrap, text.overflow = True, "ellipsis"
            shown_cells.append(text)
        self.cells.append(shown_cells)
        super().add_row(*shown_cells, **options)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        kept = list(range(len(self.columns)))
        folded: list[int] = []
        for index in self.fold:
            if self._natural_width(kept) <= options.max_width:
                break
            kept.remove(index)
            folded.append(index)
        if not folded:
            yield from super().__rich_console__(console, options)
            return
        folded.sort()
        widths = self._fitted_widths(kept, options.max_width)
        yield self._part(kept, widths, None)
        for row in self.cells:
            yield self._part(kept, widths, row)
            shown_folds = [
                (index, row[index]) for index in folded if row[index].plain not in FOLD_EMPTY
            ]
            if shown_folds:
                line = RichText("  ").join(
                    RichText.assemble((f"{self.columns[index].header}: ", "dim"), _one_line(cell))
                    for index, cell in shown_folds
                )
                yield Padding(line, (0, 0, 0, FOLD_INDENT))

    def _natural(self, index: int) -> int:
        """The width column ``index`` takes with nothing cut or wrapped (an id's column
        up to WHOLE_WIDTH)."""
        column = self.columns[index]
        lines = str(column.header).splitlines() or [""]
        for row in self.cells:
            lines += row[index].plain.splitlines()
        natural = max(cell_len(line) for line in lines)
        if index in self.whole:
            natural = min(natural, max(WHOLE_WIDTH, column.min_width or 0))
        return natural

    def _natural_width(self, kept: Sequence[int]) -> int:
        return sum(self._natural(i) for i in kept) + COLUMN_GAP * (len(kept) - 1)

    def _fitted_widths(self, kept: Sequence[int], room: int) -> dict[int, int]:
        """Natural widths, the columns that may wrap or be cut (not ids, not times)
        narrowed, the widest first, until the table fits in ``room`` (or they can give
        no more: then rich squeezes)."""
        widths = {i: self._natural(i) for i in kept}
        narrowable = [i for i in kept if i not in self.whole and not self.columns[i].no_wrap]
        excess = self._natural_width(kept) - room
        while excess > 0:
            widest = max(narrowable, key=lambda i: widths[i], default=None)
            if widest is None or widths[widest] <= NARROWEST:
                break
            widths[widest] -= 1
            excess -= 1
        return widths

    def _part(
        self, kept: Sequence[int], widths: dict[int, int], row: list[RichText] | None
    ) -> RichTable:
        """The heading (``row`` None) or one row, of the ``kept`` columns at ``widths``:
        every part has the same widths, so their columns line up."""
        columns = []
        for index in kept:
            given = self.columns[index]
            columns.append(
                Column(
                    given.header, header_style=given.header_style, style=given.style,
                    justify=given.justify, overflow=given.overflow, no_wrap=given.no_wrap,
                    width=widths[index],
                )
            )  # fmt: skip
        part = RichTable(
            *columns, show_header=row is None, header_style=self.header_style, **self.options
        )
        if row is not None:
            part.add_row(*(row[index] for index in kept))
        return part


#: How a folded row's line is set off: indented under the row, and its cells that hold
#: nothing (no error) left out.
FOLD_INDENT = 2
FOLD_EMPTY = ("", "-")
#: The room between two columns (the tables' padding), and the narrowest a column that
#: may wrap is made before the table gives up fitting.
COLUMN_GAP = 2
NARROWEST = 6


def _one_line(cell: RichText) -> RichText:
    """A folded cell's text on one line (wrapped at the terminal's width), its lines joined."""
    text = RichText(", ").join(cell.split("\n"))
    text.no_wrap, text.overflow = False, "fold"
    return text


def shown(text: str) -> str:
    """``text`` safe to print: what is not UTF-8 (read from Redis) escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def stdout_console() -> Console:
    # Made per use, not at import: it reads $COLUMNS and the stream of the moment.
    return Console()


def stderr_console() -> Console:
    return Console(stderr=True)


def fail(message: str, code: int) -> NoReturn:
    errors = stderr_console()
    errors.print("[red]error:[/red] ", end="", highlight=False)
    # Not wrapped at the terminal's width: a hint copied from it (a command) stays whole.
    errors.print(shown(message), markup=False, highlight=False, soft_wrap=True)
    sys.exit(code)


def say(message: str) -> None:
    """A remark for the person at the terminal, on stderr (stdout stays for results)."""
    stderr_console().print(shown(message), markup=False, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def progress_bar() -> Iterator[Progress]:
    """A progress bar on stderr for a person watching; hidden when stderr is not a
    terminal (a log file, a pipe), where it would be noise."""
    errors = stderr_console()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(
        *columns,
        TimeElapsedColumn(),
        console=errors,
        transient=True,
        disable=not errors.is_terminal,
    ) as progress:
        yield progress


def display_zone(preferred: tzinfo | None = None) -> tzinfo | None:
    """The zone to show times in: UTC under --utc, else ``preferred`` (a cron job's
    zone), else None: this host's local zone."""
    context = click.get_current_context(silent=True)
    if context is not None and context.meta.get("duetime.utc"):
        return UTC
    return preferred


def shown_time(seconds: float | None, zone: tzinfo | None = None) -> str:
    return times.format_time(seconds, display_zone(zone))


_STATUS_TIMES = ("run_at", "died_at", "finished_at", "cancel_asked_at", "last_at")


def print_status(found: TaskStatus) -> None:
    """A task's status as JSON, its times in ISO 8601 (local zone, or UTC with --utc)."""
    _print_report(dataclasses.asdict(found))


def print_task(task_id: str, found: TaskStatus | None, history: Sequence[FinishedAttempt]) -> None:
    """A task's status and its finished attempts (``history``, latest first) as JSON,
    times as ``print_status`` shows them. A finished task says how it ended ("outcome",
    its latest attempt's), also when its result is no longer kept and only the history
    knows it (then its handler, attempt and end come from there)."""
    report: dict[str, Any] = {"id": task_id, "state": "unknown"}
    if found is not None:
        report = dataclasses.asdict(found)
    elif history:
        last = history[0]
        # An expired task's last claim found it expired and did not start it.
        started = last.attempt - (last.outcome == HistoryOutcome.EXPIRED)
        report |= {"state": "finished", "task": last.task, "attempts": started}
        report["finished_at"] = last.finished_at
    if report["state"] == "finished" and history:
        report["outcome"] = history[0].outcome
    report["history"] = [dataclasses.asdict(attempt) for attempt in history]
    _print_report(report)


def _print_report(report: dict[str, Any]) -> None:
    zone = display_zone()
    for record in (report, *report.get("history", ())):
        for name in _STATUS_TIMES:
            if record.get(name) is not None:
                record[name] = times.format_time(record[name], zone, precise=True)
    keyed = report.get("keyed")
    if keyed and keyed["until"] is not None:  # a debounce deadline or a window's end
        keyed["until"] = times.format_time(keyed["until"], zone, precise=True)
    click.echo(json.dumps(report, default=str, indent=2))
