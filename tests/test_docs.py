"""The documentation: the mkdocs site builds in strict mode, every page is in its nav, and the
README stays a short front door whose links all lead somewhere."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MAX_README_LINES = 250


def nav_pages(nav) -> set[str]:
    """Every page path named anywhere in a mkdocs nav (nested lists of {title: path-or-list})."""
    if isinstance(nav, str):
        return set() if re.match(r"[a-z]+://", nav) else {nav}
    if isinstance(nav, list):
        return set().union(*(nav_pages(item) for item in nav)) if nav else set()
    if isinstance(nav, dict):
        return set().union(*(nav_pages(value) for value in nav.values())) if nav else set()
    return set()


def relative_links(markdown: str) -> list[str]:
    """The targets of the markdown links and images that point into the repository, without
    their #fragment."""
    targets = re.findall(r'!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)', markdown)
    out = []
    for target in targets:
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s)://, mailto:, or an anchor on the same page
        out.append(target.split("#", 1)[0])
    return out


def test_the_site_builds_in_strict_mode(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=600,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()


def test_every_page_under_docs_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    listed = nav_pages(config.get("nav"))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert not pages - listed, f"pages under docs/ that mkdocs.yml's nav does not list: {sorted(pages - listed)}"
    assert not listed - pages, f"nav entries with no page under docs/: {sorted(listed - pages)}"


def test_the_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines, more than {MAX_README_LINES}: move details to docs/")


def test_every_relative_link_of_the_readme_points_at_a_file():
    links = relative_links(README.read_text(encoding="utf-8"))
    assert links, "the README links into docs/"
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README.md links to paths that do not exist: {missing}"


def test_the_link_finder_sees_links_and_images_and_skips_urls_and_anchors():
    text = '[a](docs/a.md#x) ![b](docs/b.png "a title") [c](https://x.org/y) [d](#here) [e](mailto:x@y.org)'
    assert relative_links(text) == ["docs/a.md", "docs/b.png"]
