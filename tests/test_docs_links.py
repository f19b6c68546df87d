"""The manual's links and citations point at things that exist.

The README and docs cite result files by name and link to each other's sections; a renamed
heading or a removed result file would leave them pointing at nothing. These checks read the
markdown as it is committed: every relative link reaches a file (and, for a markdown file, a
heading), every result file the manual names is in bench/results/, and bench/results/README.md
indexes exactly the files there. The benchmark log is history: its links are checked, but the
result files it names may have been removed (git keeps them).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
LOG = REPO / "docs" / "benchmark-log.md"
MANUAL = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), RESULTS / "README.md"]

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
RESULT_NAME = re.compile(r"bench/results/([\w.-]+\.(?:json|md|png))")
FENCE = re.compile(r"^\s*(```|~~~)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks (a shell comment there is no heading)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(line)
    return "\n".join(kept)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    """Every anchor GitHub makes for the headings of a markdown file (repeats get -1, -2, ...)."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose(path.read_text()).splitlines():
        match = HEADING.match(line)
        if not match:
            continue
        slug = _slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def broken_links(path: Path) -> list[str]:
    """The relative links of a markdown file whose target file or heading does not exist."""
    broken = []
    for target in LINK.findall(_prose(path.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors_of(resolved):
            broken.append(f"{target} (no such heading)")
    return broken


@pytest.mark.parametrize("path", MANUAL, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_reaches_a_file_and_heading(path: Path) -> None:
    assert broken_links(path) == [], f"{path.relative_to(REPO)}: fix or remove these links"


def test_a_missing_file_or_heading_is_reported(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Set-up: two commands\n[a](gone.md) [b](page.md#set-up-two-commands) [c](#nowhere)\n"
                    "```bash\n# a shell comment, no heading\n```\n[d](page.md#a-shell-comment-no-heading)\n")
    assert broken_links(page) == ["gone.md (no such file)", "#nowhere (no such heading)",
                                  "page.md#a-shell-comment-no-heading (no such heading)"]


def test_the_slug_rule_matches_githubs_on_the_headings_we_link() -> None:
    assert _slug("Principle 4: never make the jobs finish later") == "principle-4-never-make-the-jobs-finish-later"
    assert _slug("`oracle` (benchmarks only)") == "oracle-benchmarks-only"
    assert _slug("The pieces (adloader/dataloader/)") == "the-pieces-adloaderdataloader"


@pytest.mark.parametrize("path", [p for p in MANUAL if p != LOG], ids=lambda p: str(p.relative_to(REPO)))
def test_every_result_file_the_manual_names_exists(path: Path) -> None:
    missing = sorted({name for name in RESULT_NAME.findall(path.read_text()) if not (RESULTS / name).exists()})
    assert missing == [], f"{path.relative_to(REPO)} cites result files not in bench/results/: {missing}"


def test_the_results_index_lists_exactly_the_files_there() -> None:
    index = (RESULTS / "README.md").read_text()
    rows = [line for line in index.splitlines() if line.startswith("| `")]
    listed = {name for row in rows for name in re.findall(r"`([\w.-]+\.(?:json|md|png))`", row.split("|")[1])}
    present = {p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "README.md"}
    assert sorted(present - listed) == [], "result files missing from bench/results/README.md"
    assert sorted(listed - present) == [], "bench/results/README.md lists files that are not there"


@pytest.mark.parametrize("path", MANUAL, ids=lambda p: str(p.relative_to(REPO)))
def test_the_manual_names_no_internal_issue_numbers(path: Path) -> None:
    found = re.findall(r"\b[Ii]ssues? #?\d+", path.read_text())
    assert found == [], f"{path.relative_to(REPO)}: say what changed and when, not which issue: {found}"
