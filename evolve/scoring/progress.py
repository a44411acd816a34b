"""The terminal's progress display for long jobs (``evolve run``, ``evolve promote``): progress bars
while rollouts run, a table row per generation; on stderr. An :class:`~evolve.scoring.session.Observer`,
here so that each command that scores (the CLI's run, deploy's promote) shows the same display."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

console = Console(stderr=True)


class RichObserver:
    """Progress bars while rollouts run, a table row per generation."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._task: Any = None  # rich's TaskID of the current phase
        self._header_shown = False
        self.run_dir: Path | None = None  # where the run writes (the Engine says, once it has opened it)

    def __enter__(self) -> RichObserver:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def phase(self, description: str, total: int) -> None:
        if self._task is not None:
            self.progress.remove_task(self._task)
        self._task = self.progress.add_task(description, total=total)

    def advance(self, n: int = 1) -> None:
        if self._task is not None:
            self.progress.advance(self._task, n)

    def generation(self, row: dict[str, Any]) -> None:
        """One line per generation under a header printed once; fits an 80-column terminal whole."""
        self.progress.console.print(generation_table(row, header=not self._header_shown))
        self._header_shown = True

    def message(self, text: str) -> None:
        from rich.text import Text

        self.progress.console.print(Text(text, style="dim"))

    def started(self, run_dir: Path) -> None:
        self.run_dir = run_dir


# (header, width): 62 columns of text and 16 of gaps, so a row fits an 80-column terminal
GENERATION_COLUMNS = (
    ("gen", 3),
    ("best val", 8),
    ("best", 8),
    ("children", 8),
    ("accepted", 8),
    ("rollouts", 8),
    ("calls", 6),
    ("tokens", 6),
    ("seconds", 7),
)


def compact(n: Any) -> str:
    """A count in at most 6 characters: 99999, then 123.5k, 98.8M, 3.2G."""
    if not isinstance(n, (int, float)):
        return "—" if n is None else str(n)
    for limit, div, unit in ((1e5, 1, ""), (1e6, 1e3, "k"), (1e9, 1e6, "M")):
        if abs(n) < limit:
            return f"{n / div:.{0 if div == 1 else 1}f}{unit}"
    return f"{n / 1e9:.1f}G"


def generation_table(row: dict[str, Any], *, header: bool = True) -> Any:
    """A generation's row (with the header above it when ``header``) as a rich Table of fixed widths."""
    from rich.table import Table

    t = Table(box=None, padding=(0, 1), pad_edge=False, show_header=header, header_style="bold")
    for name, width in GENERATION_COLUMNS:
        t.add_column(
            name, width=width, no_wrap=True, overflow="ellipsis", justify="left" if name == "best" else "right"
        )
    t.add_row(
        str(row["index"]),
        f"{row['best_val']:.3f}",
        row["best"][:8],
        str(row.get("children", 0)),
        str(row.get("accepted", 0)),
        compact(row.get("rollouts", 0)),
        compact(row.get("calls")),
        compact(row.get("tokens", 0)),
        _seconds(float(row.get("seconds", 0) or 0)),
    )
    return t


def _seconds(s: float) -> str:
    return f"{s:.1f}" if s < 1e4 else compact(s)
