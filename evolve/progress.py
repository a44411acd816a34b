"""The terminal's progress display for long jobs (``evolve run``, ``evolve promote``): progress bars
while rollouts run, a table row per generation; on stderr."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

console = Console(stderr=True)


class RichObserver:
    """Progress bars while rollouts run, a table row per generation."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=True)
        self._task = None
        self.run_dir: Path | None = None  # where the run writes (the Engine says, once it has opened it)

    def __enter__(self) -> "RichObserver":
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
        from rich.table import Table

        t = Table(title=f"generation {row['index']}", show_header=True, header_style="bold")
        for col in ("best val", "best system", "children", "accepted", "rollouts", "LLM calls", "tokens", "seconds"):
            t.add_column(col)
        t.add_row(f"{row['best_val']:.3f}", row["best"][:12], str(row.get("children", 0)), str(row.get("accepted", 0)),
                  str(row.get("rollouts", 0)), str(row.get("calls", "—")), str(row.get("tokens", 0)),
                  str(row.get("seconds", 0)))
        self.progress.console.print(t)

    def message(self, text: str) -> None:
        from rich.text import Text

        self.progress.console.print(Text(text, style="dim"))

    def started(self, run_dir: Path) -> None:
        self.run_dir = run_dir
