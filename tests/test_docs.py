"""The docs as a manual: their lengths, README's measurements each with its results file, links
that resolve, and benchmark commands in one form."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]

#: the most lines each may have
LENGTHS = {"docs/memory.md": 350, "docs/benchmarks.md": 450}
#: README's Measurements: at most this many non-empty lines, each one figure and its file
MEASUREMENT_LINES = 5

LINK = re.compile(r"\]\(([^)\s]+)\)")
RESULTS_FILE = re.compile(r"benchmarks/results/[\w./-]+\.json")


def _section(text: str, heading: str) -> list[str]:
    """The lines under ``## heading`` up to the next ``## `` heading."""
    lines = text.splitlines()
    start = lines.index(f"## {heading}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def _prose(text: str) -> str:
    """``text`` without fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub makes of a Markdown file's headings (``-1``, ``-2`` for repeats)."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose(path.read_text()).splitlines():
        match = re.match(r"#{1,6} (.*)", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match[1].strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


@pytest.mark.parametrize("doc,most", sorted(LENGTHS.items()))
def test_each_manual_page_is_within_its_length(doc, most):
    lines = len((REPO / doc).read_text().splitlines())
    assert lines <= most, f"{doc}: {lines} lines, at most {most}"


def test_readme_measurements_are_a_few_lines_each_naming_its_results_file():
    lines = [line for line in _section((REPO / "README.md").read_text(), "Measurements") if line]
    assert 0 < len(lines) <= MEASUREMENT_LINES, lines
    for line in lines:
        files = RESULTS_FILE.findall(line)
        assert files, f"names no file under benchmarks/results/: {line}"
        for name in files:
            assert (REPO / name).is_file(), name
        assert "in sample" in line or "held out" in line, line


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_between_docs_resolve(doc):
    """Every relative link names a file that exists and, into a Markdown file, a heading it has."""
    broken = []
    for target in LINK.findall(_prose(doc.read_text())):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        name, _, anchor = target.partition("#")
        path = (doc.parent / name).resolve() if name else doc
        missing_heading = anchor and path.suffix == ".md" and anchor not in _anchors(path)
        if not path.exists() or missing_heading:
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_benchmark_commands_are_written_for_the_runner(doc):
    """Outside the generated tables (which quote the command each results file recorded), a
    benchmark runs as ``python -m benchmarks <name>``."""
    generated = r"<!-- table: ([\w-]+) -->.*?<!-- /table: \1 -->"
    text = re.sub(generated, "", doc.read_text(), flags=re.S)
    text = re.sub(r"<!-- networks-table: .*?<!-- /networks-table -->", "", text, flags=re.S)
    assert re.findall(r"python3? benchmarks/\S+", text) == []
