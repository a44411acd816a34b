"""The docs teach what the code does: every code block marked ``python runnable`` in README.md and
docs/ runs as printed, the task-file reference is the one the config models generate, and every
link between the pages leads somewhere."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python runnable\n(.*?)^```", re.S | re.M)


def _blocks() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for i, m in enumerate(BLOCK.finditer(page.read_text())):
            out.append((f"{page.relative_to(ROOT)}#{i + 1}", m.group(1)))
    return out


BLOCKS = _blocks()


def test_the_runnable_blocks_are_found():
    names = [n for n, _ in BLOCKS]
    assert "README.md#1" in names and sum(n.startswith("docs/extending.md") for n in names) >= 6


@pytest.mark.parametrize("name, code", BLOCKS, ids=[n for n, _ in BLOCKS])
def test_a_runnable_block_runs_as_printed(tmp_path, name, code):
    (tmp_path / "block.py").write_text(code)
    r = subprocess.run([sys.executable, "block.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{name}:\n{r.stdout}\n{r.stderr}"


def test_the_task_file_reference_is_up_to_date():
    from evolve.task.reference import generated_part, task_file_reference

    assert generated_part(ROOT / "docs" / "task-file.md") == task_file_reference(), (
        "docs/task-file.md is out of date: python -m evolve.task.reference --write docs/task-file.md"
    )


def test_links_between_pages_lead_to_files_that_exist():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_files_the_pages_name_exist():
    """Paths in backticks that look like files of this repository (`evolve/scoring/session.py`) exist."""
    missing = []
    for page in PAGES:
        for path in re.findall(
            r"`((?:evolve|policy|memory|prompts|toolforge|topology|sandbox|bench|examples|tests|docs)"
            r"/[\w./-]+\.(?:py|md|yaml|json|sh))`",
            page.read_text(),
        ):
            if not (ROOT / path).exists():
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert not missing, missing
