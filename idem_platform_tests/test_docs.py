"""The documentation stays true: links resolve, documented config loads, documented commands exist.

README.md and docs/*.md are what a new user reads first. These checks run without
PostgreSQL or Spark, so a broken link, an ``idem.yaml`` example the loader refuses, or
a ``make``/``idem`` command that no longer exists fails the suite instead of a user's
first five minutes. They also keep the pages documentation rather than a lab
notebook: no session diaries, commit hashes or issue numbers in prose.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
import yaml

from idem_platform.cli import idem
from idem_platform.cli.output import CommandError
from idem_platform.config import load_config

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]
PROSE_PAGES = [*PAGES, REPO / "CHANGELOG.md"]
MAX_README_LINES = 400

_FENCE = re.compile(r"^```([A-Za-z0-9_-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
_HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
_INLINE_CODE = re.compile(r"`+([^`]+?)`+")
# A token of 7-40 hex digits holding both a digit and a letter: what `git log` prints.
_HEX = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
_ISSUE = re.compile(r"\b(?:issues?|tickets?|PR)\s*#?\d+\b", re.I)
_MAKE_TARGET = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)\s*:(?!=)", re.M)


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int
    lang: str
    text: str

    @property
    def label(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The page's fenced code blocks, with the line each starts on."""
    text = page.read_text(encoding="utf-8")
    return [
        Block(page, text.count("\n", 0, match.start()) + 1, match.group(1).lower(), match.group(2))
        for match in _FENCE.finditer(text)
    ]


def prose(page: Path) -> str:
    """The page without its fenced code blocks (what the reader reads as text)."""
    return _FENCE.sub("", page.read_text(encoding="utf-8"))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = _INLINE_CODE.sub(r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a link into ``page`` may name: headings (numbered when repeated) and
    explicit ``<a id>`` tags."""
    text = prose(page)
    found: set[str] = set(_HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for heading in _HEADING.findall(text):
        base = slug(heading)
        count = seen.get(base, 0)
        found.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return found


def relative_links() -> Iterator[tuple[Path, str]]:
    """Every link of every page that is not a web address (the page, the link's target)."""
    for page in PAGES:
        for target in _LINK.findall(_INLINE_CODE.sub("", prose(page))):  # `[x](y)` in code is no link
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
                continue
            yield page, target


def _link_id(case: tuple[Path, str]) -> str:
    return f"{case[0].relative_to(REPO)}->{case[1]}"


def test_there_are_pages_and_links_to_check() -> None:
    assert DOCS, "docs/*.md is missing"
    assert len(list(relative_links())) >= 20


@pytest.mark.parametrize("case", list(relative_links()), ids=_link_id)
def test_every_relative_link_resolves(case: tuple[Path, str]) -> None:
    page, target = case
    path_part, _, fragment = target.partition("#")
    resolved = (page.parent / path_part).resolve() if path_part else page
    assert resolved.exists(), f"{page.name}: link to {target!r}: {resolved} does not exist"
    assert REPO in resolved.parents or resolved == REPO, f"{page.name}: {target!r} leaves the repository"
    if fragment and resolved.suffix == ".md":
        assert fragment in anchors(resolved), (
            f"{page.name}: link to {target!r}: no heading or <a id> in {resolved.name} makes "
            f"#{fragment} (anchors: {sorted(anchors(resolved))})"
        )


def test_readme_is_a_front_page_not_a_notebook() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail into docs/ (at most {MAX_README_LINES})"


@pytest.mark.parametrize("page", PROSE_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_pages_carry_no_diary_hashes_or_issue_numbers(page: Path) -> None:
    text = prose(page)
    assert "this session" not in text.lower(), f"{page.name}: 'this session' (a diary, not documentation)"
    hashes = _HEX.findall(_INLINE_CODE.sub(" ", text))
    # Inside inline code a key or a position may hold hex; a span that is nothing but a
    # hash is still a commit reference.
    hashes += [span for span in _INLINE_CODE.findall(text) if _HEX.fullmatch(span.strip())]
    assert not hashes, f"{page.name}: commit-hash-like tokens in prose: {hashes}"
    issues = _ISSUE.findall(text)
    assert not issues, f"{page.name}: issue references in prose: {issues}"


def idem_yaml_blocks() -> list[Block]:
    """Fenced ``yaml`` blocks shaped like an idem.yaml: ``connectors:`` or ``tables:`` at the top."""
    found = []
    for page in PAGES:
        for block in blocks(page):
            if block.lang not in ("yaml", "yml"):
                continue
            data = yaml.safe_load(block.text)
            if isinstance(data, dict) and ("connectors" in data or "tables" in data):
                found.append(block)
    return found


def test_the_readme_documents_an_idem_yaml() -> None:
    assert any(block.page == README for block in idem_yaml_blocks())


@pytest.mark.parametrize("block", idem_yaml_blocks(), ids=lambda b: b.label)
def test_documented_idem_yaml_loads_as_written(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Examples may name a broker by ${KAFKA_BOOTSTRAP_SERVERS}: give it one if the shell has none.
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    monkeypatch.setenv("SOAR_TOKEN", "doc-token")  # docs/effects.md's receiver token
    data = yaml.safe_load(block.text)
    for connector in data.get("connectors") or []:
        if isinstance(connector, dict) and isinstance(connector.get("path"), str):
            (tmp_path / connector["path"]).mkdir(parents=True, exist_ok=True)
    config_file = tmp_path / "idem.yaml"
    config_file.write_text(block.text, encoding="utf-8")
    config = load_config(config_file)  # raises ConfigError naming the key and line
    assert config.connectors or config.tables


def shell_commands(block: Block) -> Iterator[list[str]]:
    """The commands of a ``bash`` block as argv lists: continuations joined, heredoc bodies
    and comments left out, leading ``VAR=value`` assignments dropped."""
    lines = block.text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        while line.endswith("\\") and index + 1 < len(lines):
            index += 1
            line = line[:-1] + " " + lines[index]
        index += 1
        heredoc = re.search(r"<<-?\s*'?\"?(\w+)'?\"?", line)
        if heredoc:
            while index < len(lines) and lines[index].strip() != heredoc.group(1):
                index += 1
            index += 1
            line = line[: heredoc.start()]
        argv = shlex.split(line, comments=True)
        while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):
            argv = argv[1:]
        if argv:
            yield argv


def make_targets() -> set[str]:
    """The Makefile's targets (rules and .PHONY)."""
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(_MAKE_TARGET.findall(text))
    for phony in re.findall(r"^\.PHONY:(.*)$", text, re.M):
        targets.update(phony.split())
    return targets - {".PHONY"}


def documented_commands() -> list[tuple[str, list[str]]]:
    """Every ``make`` or ``idem`` command in the README's ``bash`` blocks (and the docs')."""
    found = []
    for page in PAGES:
        for block in blocks(page):
            if block.lang in ("bash", "sh", "shell", "console"):
                for argv in shell_commands(block):
                    if Path(argv[0]).name in ("make", "idem"):
                        found.append((block.label, argv))
    return found


def parse_idem(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Parse ``idem ARGS`` with the CLI's own Click commands, running none of them.

    Every command's and group's callback is swapped for a no-op, so Click resolves the
    subcommands and checks every option, argument, choice and type, as ``idem`` would.
    A value check that says a placeholder is no real value (``--commit COMMIT_ID``: not a
    UUID) is no error of the command line.

    Raises:
        click.UsageError: a command, option or argument that is not there.
    """
    stack: list[click.Command] = [idem]
    while stack:
        command = stack.pop()
        monkeypatch.setattr(command, "callback", lambda *a, **k: None)
        if isinstance(command, click.Group):
            stack.extend(command.commands.values())
    try:
        idem.main(args, prog_name="idem", standalone_mode=False)
    except CommandError:
        pass


def test_the_readme_shows_make_demo_and_make_test() -> None:
    readme = [argv for label, argv in documented_commands() if label.startswith("README.md")]
    assert ["make", "demo"] in readme and ["make", "test"] in readme
    assert any(argv[0] == "idem" for argv in readme)


@pytest.mark.parametrize("case", documented_commands(), ids=lambda c: f"{c[0]}:{' '.join(c[1])[:60]}")
def test_documented_commands_exist(case: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    label, argv = case
    if Path(argv[0]).name == "make":
        wanted = [arg for arg in argv[1:] if not arg.startswith("-") and "=" not in arg]
        unknown = sorted(set(wanted) - make_targets())
        assert wanted and not unknown, f"{label}: `{' '.join(argv)}`: no Makefile target {unknown or '(none named)'}"
        return
    try:
        parse_idem(argv[1:], monkeypatch)
    except click.UsageError as exc:  # Click's way of refusing: a subcommand or option that is not there
        raise AssertionError(f"{label}: `{' '.join(argv)}` is not a valid idem command line") from exc


def test_the_command_check_refuses_what_does_not_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks above would pass vacuously if they accepted anything."""
    for wrong in (
        ["frobnicate"], ["ingest", "--no-such-option"], ["rejects", "retry", "--limit", "3"],
        ["retype", "malware", "score"], ["retype", "malware", "score", "--to", "complex"], ["spark", "restart"],
    ):
        with pytest.raises(click.UsageError):
            parse_idem(wrong, monkeypatch)
    parse_idem(["--config", "idem.yaml", "rejects", "retry", "--dry-run", "-v"], monkeypatch)
    assert "demo" in make_targets() and "frobnicate" not in make_targets()


def _tracked_text_files() -> list[Path]:
    """The repository's tracked text files (``git ls-files``), or none outside a git checkout."""
    done = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=False)
    suffixes = {".md", ".py", ".yaml", ".yml", ".toml", ".sql", ".c", ".pyi", ".cfg", ".txt"}
    names = done.stdout.splitlines() if done.returncode == 0 else []
    return [REPO / n for n in names if Path(n).suffix in suffixes or Path(n).name == "Makefile"]


def test_no_merge_conflict_markers_are_committed() -> None:
    """A merge resolved by hand once left ``<<<<<<<``/``=======``/``>>>>>>>`` in a page that
    still rendered; nothing else would have noticed."""
    markers = re.compile(r"^(<{7} |={7}$|>{7} )", re.M)
    found = [
        f"{path.relative_to(REPO)}:{text[: m.start()].count(chr(10)) + 1}"
        for path in _tracked_text_files()
        if path.is_file()
        for text in [path.read_text(encoding="utf-8", errors="replace")]
        for m in markers.finditer(text)
    ]
    assert not found, f"merge conflict markers: {found}"
