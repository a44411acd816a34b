"""The agent skill (skills/evolvekit/SKILL.md) and docs/mcp.md name only what exists: every `evolve`
command (with its subcommand and options) is one of the CLI's, and every tool is one the server lists."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import anyio
import pytest
import typer.main
import yaml

from tests.helpers import ROOT

SKILL = ROOT / "skills" / "evolvekit" / "SKILL.md"
PAGES = [SKILL, ROOT / "docs" / "mcp.md"]
IDENT = re.compile(r"^[a-z]+(?:_[a-z]+)+$")


def _cli():
    """The `evolve` command as click sees it, with the groups `evolve` mounts as it starts."""
    from evolve.cli.commands import app
    from evolve.registry import commands

    group = typer.main.get_command(app)
    for name in commands.names():
        group.commands.setdefault(name, typer.main.get_command(commands.get(name)))
    return group


def _tools(tmp_path: Path) -> dict[str, dict]:
    """Tool name -> input schema, from the server's own list_tools."""
    from evolve.mcp.roots import Roots
    from evolve.mcp.server import build_server

    server = build_server(Roots([tmp_path]))
    return {t.name: t.input_schema for t in anyio.run(server.list_tools)}


def _code(text: str) -> list[str]:
    """The text of fenced blocks (line by line) and inline code spans."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    rest = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    return [ln for b in blocks for ln in b.splitlines()] + re.findall(r"`([^`\n]+)`", rest)


def _commands(text: str) -> list[list[str]]:
    """Each `evolve ...` command line in code, as words (up to a comment or the line's end)."""
    out = []
    for snippet in _code(text):
        for m in re.finditer(r"(?:^|[\s(])evolve ([a-z][^#\n]*)", snippet):
            try:
                words = shlex.split(m.group(1))
            except ValueError:
                words = m.group(1).split()
            out.append(words)
    return out


def test_the_skill_has_front_matter_with_a_name_and_a_description():
    text = SKILL.read_text()
    m = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    assert m, "SKILL.md starts with YAML front matter between --- lines"
    meta = yaml.safe_load(m.group(1))
    assert meta["name"] == "evolvekit" and len(meta["description"]) > 50
    for heading in ("## When to use", "## Steps"):
        assert heading in text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_evolve_command_named_exists_with_its_options(page):
    cli = _cli()
    found = _commands(page.read_text())
    assert len(found) >= 5, found
    wrong = []
    for words in found:
        cmd = cli.commands.get(words[0])
        if cmd is None:
            wrong.append(f"evolve {words[0]}: no such command")
            continue
        rest = words[1:]
        if hasattr(cmd, "commands"):  # a group: the next word is its subcommand
            sub = cmd.commands.get(rest[0]) if rest else None
            if sub is None:
                wrong.append(f"evolve {' '.join(words[:2])}: no such subcommand")
                continue
            cmd, rest = sub, rest[1:]
        opts = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        for w in rest:
            flag = w.split("=", 1)[0]
            if flag.startswith("-") and flag not in opts:
                wrong.append(f"evolve {' '.join(words)}: no option {flag}")
    assert not wrong, wrong


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_tool_named_is_one_the_server_lists(page, tmp_path):
    tools = _tools(tmp_path)
    arguments = {name for schema in tools.values() for name in schema.get("properties", {})}
    source = "".join(p.read_text() for p in (ROOT / "evolve" / "mcp").glob("*.py"))
    named = {w for w in re.findall(r"`([^`\n]+)`", page.read_text()) if IDENT.match(w)}
    assert named & set(tools), "the page names no tool"
    # A snake_case word in backticks is a tool, a tool's argument, or a word the tools answer with.
    unknown = sorted(w for w in named - set(tools) - arguments if f'"{w}"' not in source)
    assert not unknown, f"{page.name} names tools that do not exist: {unknown}"


def test_the_skill_lists_every_tool(tmp_path):
    tools = set(_tools(tmp_path))
    section = SKILL.read_text().split("## Tools", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"`([a-z_]+)`", section)) & tools == tools
