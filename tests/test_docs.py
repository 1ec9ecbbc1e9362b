"""The docs as a manual: their lengths, README's measurements each with its results file, links
that resolve, and benchmark commands in one form."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]

#: the most lines each may have (benchmarks.md: with the rows of every held-out grid up to
#: held-out-2026-12-07's, the AVX-512 stand-in's two in-sample grids, and what results files are:
#: append-only, each checked against the sources its benchmark declares, the worst held-out row,
#: and the lever time factors' every run of the same code by its worst row)
LENGTHS = {"docs/memory.md": 350, "docs/benchmarks.md": 756}
#: README's Measurements: at most this many bullets of at most this many characters
MEASUREMENT_BULLETS, BULLET_WIDTH = 5, 300
#: README a front door: at most this many lines
README_LINES = 200

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


def _table_section(anchor: str) -> str:
    """docs/benchmarks.md under the heading whose anchor is ``anchor``, to the next heading of
    the same or a higher level."""
    lines = (REPO / "docs" / "benchmarks.md").read_text().splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"(#{1,6}) (.*)", line)
        if match and re.sub(r"[^\w\- ]", "", match[2].strip().lower()).replace(" ", "-") == anchor:
            level = len(match[1])
            end = next(
                (j for j in range(i + 1, len(lines)) if re.match(rf"#{{1,{level}}} ", lines[j])),
                len(lines),
            )
            return "\n".join(lines[i:end])
    raise AssertionError(f"docs/benchmarks.md has no heading #{anchor}")


def _measurements() -> list[str]:
    return [line for line in _section((REPO / "README.md").read_text(), "Measurements") if line]


def test_readme_is_a_front_door_of_few_short_lines():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_LINES, f"README.md: {len(lines)} lines, at most {README_LINES}"
    long = [f"{i}: {len(line)} characters" for i, line in enumerate(lines, 1) if len(line) > 300]
    assert long == []


@pytest.mark.parametrize("doc", sorted((REPO / "docs").glob("*.md")), ids=lambda p: p.name)
def test_no_docs_line_runs_over_400_characters(doc):
    lines = doc.read_text().splitlines()
    long = [f"{i}: {len(line)} characters" for i, line in enumerate(lines, 1) if len(line) > 400]
    assert long == []


def _bullet_problems(bullet: str) -> list[str]:
    """What is wrong with a Measurements bullet: over 300 characters, generated, not exactly one
    figure in bold, not exactly one link to its docs/benchmarks.md table, a number of its
    figure that table does not show, or no word on whether it is in sample or held out."""
    problems = []
    if not bullet.startswith("- ") or len(bullet) > BULLET_WIDTH:
        problems.append(f"not a bullet of at most {BULLET_WIDTH} characters")
    if "<!--" in bullet:
        problems.append("generated: README's prose is written by hand")
    figures = re.findall(r"\*\*([^*]+)\*\*", bullet)
    tables = re.findall(r"\]\(docs/benchmarks\.md#([\w-]+)\)", bullet)
    if len(figures) != 1 or len(tables) != 1:
        return [*problems, "not one figure in bold and one link to its table"]
    section = _table_section(tables[0])
    problems += [
        f"{number} is not in docs/benchmarks.md#{tables[0]}"
        for number in re.findall(r"\d[\d,.]*%?", figures[0])
        if number not in section
    ]
    if not re.search(r"in sample|held-out|fitted on", bullet, flags=re.I):
        problems.append("does not say whether it is in sample or held out")
    return problems


def test_readme_measurements_are_a_few_bullets_each_one_figure_from_its_linked_table():
    """At most five bullets; each gives one figure in bold with its terms and links to the
    docs/benchmarks.md table it is read from, which shows that figure (the table is generated
    from the results files, so a figure that changes under a bullet fails here)."""
    bullets = _measurements()
    assert 0 < len(bullets) <= MEASUREMENT_BULLETS, bullets
    assert {b: _bullet_problems(b) for b in bullets} == {b: [] for b in bullets}


def test_a_doctored_bullet_fails_the_measurement_check():
    bullet = _measurements()[0]
    figure = re.search(r"\*\*([^*]+)\*\*", bullet)[1]
    doctored = bullet.replace(f"**{figure}**", "**0.123456**")
    assert _bullet_problems(doctored) == [
        "0.123456 is not in docs/benchmarks.md#" + re.search(r"benchmarks\.md#([\w-]+)", bullet)[1]
    ]
    assert "generated" in " ".join(_bullet_problems(bullet + "<!-- figure: x -->"))
    assert _bullet_problems("- **1** and **2**") == [
        "not one figure in bold and one link to its table"
    ]


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
    text = re.sub(r"<!-- ((?:foreign-)?networks-table): .*?<!-- /\1 -->", "", text, flags=re.S)
    assert re.findall(r"python3? benchmarks/\S+", text) == []


#: a figure with a unit: an amount of memory, a time, a step count, a share or a factor
FIGURE = re.compile(
    r"(?<![\w.\-–])~?\d(?:[\d,.]*\d)?(?:[-–]\d(?:[\d,.]*\d)?)?"
    r"(?:\s?(?:MiB|GiB|KiB|GB|MB)\b|\s(?:ms|min|minutes|seconds|hours|s|steps|it/s|s/step"
    r"|GFLOP|TFLOP)\b|\s?%|×(?![\d(])|x\b)"
)
#: figures in prose that are not measurements, by doc: each a design constant, a default, a
#: setting or arithmetic, and why (anything else with a unit names its results file)
CONSTANTS = {
    ("README.md", "~15 s"): "the line between a quick test and a `slow` one, a policy",
    ("docs/data.md", "4×"): "arithmetic of the example: coarser pooling, fewer voxels",
    ("docs/data.md", "2×"): "the embedded dataset's z spacing and the example's arithmetic",
    ("docs/data.md", "20%"): "the augmentation's bias-field amplitude, a design constant",
    ("docs/memory.md", "500 MiB"): "the CUDA context's fallback, said to be not measured",
    ("docs/memory.md", "2 MiB"): "torch's caching allocator's segment sizes",
    ("docs/memory.md", "20 MiB"): "torch's caching allocator's segment sizes",
    ("docs/benchmarks.md", "8 GB"): "nnU-Net's default GPU memory target, its constant",
    ("docs/plan.md", "8 GB"): "nnU-Net's default GPU memory target, its constant",
    ("docs/scale-out.md", "2%"): "`callbacks.last_checkpoint.max_time_share`'s default",
    ("docs/scale-out.md", "5 minutes"): "`callbacks.last_checkpoint.save_every_minutes`'s default",
}


def _prose_blocks(text: str) -> list[str]:
    """A doc's paragraphs and lists (blank-line separated) outside the generated tables and
    sentences, the code blocks and the descriptive tables."""
    text = re.sub(r"<!-- (table|figure): ([\w-]+) -->.*?<!-- /\1: \2 -->", "", text, flags=re.S)
    text = re.sub(r"<!-- ((?:foreign-)?networks-table): .*?<!-- /\1 -->", "", text, flags=re.S)
    blocks = re.split(r"\n\s*\n", _prose(text))
    return [b for b in blocks if b.strip() and not b.lstrip().startswith("|")]


def _figures(block: str) -> list[str]:
    """The figures with a unit in a block's prose (not in code spans or link targets)."""
    prose = re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "", block))
    return [m[0] for m in FIGURE.finditer(prose)]


def test_the_figure_pattern_finds_measurements_and_skips_shapes_and_code():
    found = _figures(
        "peaks at 6,832 MiB, 7.6% off, about 4× the time, 1.41x, 2 min 26 s, 480 steps, 1-3 s; "
        "a 26×150×320 patch, `memory.budget=16GiB`, x2 accumulation, alembic 1.x, 1s and 2s"
    )
    assert found == ["6,832 MiB", "7.6%", "4×", "1.41x", "2 min", "26 s", "480 steps", "1-3 s"]


def test_every_prose_figure_names_its_results_file_in_its_paragraph():
    """Outside the generated tables and sentences, a paragraph or list that gives a figure with
    a unit names the results file under ``benchmarks/results/`` it comes from, unless the figure
    is one of the design constants, defaults and settings of :data:`CONSTANTS`."""
    unsourced, seen = [], set()
    for doc in DOCS:
        name = str(doc.relative_to(REPO))
        for block in _prose_blocks(doc.read_text()):
            # README's Measurements link each figure to its table (checked above)
            if RESULTS_FILE.search(block) or "](docs/benchmarks.md#" in block:
                continue
            for figure in _figures(block):
                if (name, figure) in CONSTANTS:
                    seen.add((name, figure))
                else:
                    unsourced.append(f"{name}: {figure!r} in {block[:80]!r}")
    assert unsourced == []
    assert set(CONSTANTS) == seen, "listed constants no doc has any more"


#: a date in prose (a held-out grid's name, e.g. ``held-out-2026-12-06``, is a name, not a date)
DATE = re.compile(r"(?<!held-out-)\b20\d\d-\d\d-\d\d\b(?!-b\b)")


def _dated_findings(text: str) -> list[str]:
    """The results files a text cites and the dates its prose gives (code spans and blocks,
    which show example paths and folder names, left out)."""
    prose = re.sub(r"`[^`]*`", "", _prose(text))
    return RESULTS_FILE.findall(text) + DATE.findall(prose)


@pytest.mark.parametrize(
    "doc", [d for d in DOCS if d.name != "benchmarks.md"], ids=lambda p: p.name
)
def test_dated_findings_live_only_in_docs_benchmarks(doc):
    """README and the manual say what a user does and why; every dated figure, with its
    results file, is in docs/benchmarks.md's generated tables, which the others link to."""
    assert _dated_findings(doc.read_text()) == []


def test_the_dated_finding_check_finds_a_file_and_a_date_and_skips_names_and_code():
    text = (
        "On 2026-12-01 it ran (benchmarks/results/cpu/2026-12-02_x.json); grid "
        "held-out-2026-12-06 and `logs/2026-11-30_08-17-07` are names.\n"
    )
    assert _dated_findings(text) == ["benchmarks/results/cpu/2026-12-02_x.json", "2026-12-01"]
