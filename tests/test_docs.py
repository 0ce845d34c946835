"""Every reference into docs/ names a page and anchor that exist, and nothing refers to a file outside
the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_DIRS = {".git", ".venv", "build", "__pycache__", ".pytest_cache", ".ruff_cache", "node_modules"}
SUFFIXES = {".py", ".md", ".yaml", ".yml"}

# `docs/page.md` or `docs/page.md#anchor` anywhere in a file (code comments, READMEs, recipes)
DOCS_CITATION = re.compile(r"(?<![\w./-])docs/([\w./-]*?\.md)(?:#([\w-]+))?")
# a relative markdown link inside a docs page: `](page.md#anchor)` or `](#anchor)`
DOCS_LINK = re.compile(r"\]\((?![a-z]+:)([\w./-]*?\.md)?(?:#([\w-]+))?\)")
# files that live next to the repository, not in it (spelled so this file does not match itself)
OUTSIDE = re.compile(r"ANSOR\.md|\.\./shared/")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def repository_files(root: Path) -> list[Path]:
    """The repository's .py, .md, .yaml files and Makefiles, outside virtual environments and builds."""
    out = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).parts
        if any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in rel[:-1]):
            continue
        if path.is_file() and (path.suffix in SUFFIXES or path.name == "Makefile"):
            out.append(path)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a markdown page's headings (outside code fences); repeats get -1, -2, ..."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def citation_problems(root: Path, skip: tuple[Path, ...] = ()) -> list[str]:
    """`file:line: why` for every broken docs reference and every reference outside the repository
    (files in `skip` are not read)."""
    problems = []
    cache: dict[Path, set[str] | None] = {}

    def check(where: str, page: Path, anchor: str | None, cited: str) -> None:
        if page not in cache:
            cache[page] = anchors(page) if page.is_file() else None
        found = cache[page]
        if found is None:
            problems.append(f"{where}: {cited} cites a page that does not exist")
        elif anchor and anchor not in found:
            problems.append(f"{where}: {cited} cites an anchor that {page.name} does not have")

    docs = root / "docs"
    for path in repository_files(root):
        if path in skip:
            continue
        rel = path.relative_to(root)
        in_docs = path.parent == docs
        for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            where = f"{rel}:{lineno}"
            for match in OUTSIDE.finditer(line):
                problems.append(f"{where}: refers to {match.group(0)!r}, a file outside the repository")
            for match in DOCS_CITATION.finditer(line):
                check(where, docs / match.group(1), match.group(2), match.group(0))
            if in_docs:
                for match in DOCS_LINK.finditer(line):
                    page = path.parent / match.group(1) if match.group(1) else path
                    check(where, page, match.group(2), match.group(0))
    return problems


def test_every_docs_citation_resolves_and_nothing_points_outside():
    assert (ROOT / "docs" / "README.md").is_file()
    # this file's own examples of broken citations are not citations
    problems = citation_problems(ROOT, skip=(Path(__file__).resolve(),))
    assert not problems, "\n".join(problems)


def test_anchors_follow_github_headings(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n## Sketch rules\n### x86-64: AVX2 and `AVX-512`\n## Notes\n## Notes\n"
        "```\n# not a heading\n```\n"
    )
    assert anchors(page) == {"title", "sketch-rules", "x86-64-avx2-and-avx-512", "notes", "notes-1"}


@pytest.mark.parametrize(
    "text, why",
    [
        ("# see docs/search.md#no-such-anchor\n", "cites an anchor that search.md does not have"),
        ("# see docs/nowhere.md\n", "cites a page that does not exist"),
        ("# as ANSOR" + ".md §2.1 says\n", "a file outside the repository"),
        ("see .." + "/shared/DESIGN.md\n", "a file outside the repository"),
    ],
)
def test_broken_citations_are_reported(tmp_path, text, why):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "search.md").write_text("# Search\n## Sketch rules\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("# docs/search.md#sketch-rules is fine\n" + text)
    problems = citation_problems(tmp_path)
    assert len(problems) == 1 and problems[0].startswith("pkg/mod.py:2:") and why in problems[0]


def test_broken_links_between_docs_pages_are_reported(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text(
        "# A\n## Here\n[ok](b.md#there) [ok](#here) [web](https://x.org/y.md)\n[bad](#gone)\n"
    )
    (docs / "b.md").write_text("# B\n## There\n[bad](a.md#there)\n")
    assert sorted(citation_problems(tmp_path)) == [
        "docs/a.md:4: ](#gone) cites an anchor that a.md does not have",
        "docs/b.md:3: ](a.md#there) cites an anchor that a.md does not have",
    ]


def test_makefiles_and_recipes_are_scanned(tmp_path):
    (tmp_path / "Makefile").write_text("# docs/missing.md\n")
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.yaml").write_text("# docs/missing.md\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "x.py").write_text("# docs/missing.md\n")
    problems = citation_problems(tmp_path)
    assert [p.split(":")[0] for p in sorted(problems)] == ["Makefile", "recipes/r.yaml"]
