"""The terminal's per-generation table: whole headers and rows within 80 columns, the header once."""

from __future__ import annotations

import io

from rich.console import Console

from evolve.scoring.progress import GENERATION_COLUMNS, RichObserver, compact


def rendered(rows: list[dict], monkeypatch, width: int = 80) -> list[str]:
    buf = io.StringIO()
    monkeypatch.setattr(
        "evolve.scoring.progress.console", Console(file=buf, width=width, force_terminal=False, color_system=None)
    )
    obs = RichObserver()
    for row in rows:
        obs.generation(row)
    return buf.getvalue().splitlines()


def test_each_generation_is_one_line_under_one_whole_header_within_80_columns(monkeypatch):
    big = {
        "index": 12,
        "best_val": 0.9876,
        "best": "0123456789abcdef",
        "children": 12345,
        "accepted": 999,
        "rollouts": 1_234_567,
        "calls": 98_765_432,
        "tokens": 3_210_987_654,
        "seconds": 123456.7,
    }
    lines = rendered(
        [
            {
                "index": 0,
                "best_val": 0.0,
                "best": "c193b1347bfb666b",
                "rollouts": 20,
                "calls": 20,
                "tokens": 97,
                "seconds": 0.04,
            },
            big,
        ],
        monkeypatch,
    )
    assert len(lines) == 3 and max(map(len, lines)) <= 80
    assert lines[0].split() == [
        "gen",
        "best",
        "val",
        "best",
        "children",
        "accepted",
        "rollouts",
        "calls",
        "tokens",
        "seconds",
    ]  # every header whole: nothing cut to "childr…"
    assert "…" not in "".join(lines)
    assert lines[2].split() == ["12", "0.988", "01234567", "12345", "999", "1.2M", "98.8M", "3.2G", "123.5k"]
    assert sum(w for _, w in GENERATION_COLUMNS) + 2 * (len(GENERATION_COLUMNS) - 1) <= 80


def test_counts_fit_six_characters():
    assert [compact(x) for x in (97, 99_999, 123_456, 98_765_432, 3.2e9, None)] == [
        "97",
        "99999",
        "123.5k",
        "98.8M",
        "3.2G",
        "—",
    ]
