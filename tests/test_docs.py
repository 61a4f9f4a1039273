"""The README is the newcomer's page and docs/ holds the rest: the README stays short, every
relative link of the README and of docs/ reaches a file (and a heading, where it names one), and
the README's `autok.Sync` loop runs as printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 330  # the two commands, the flag tour, autok.Sync, where to go next
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target), an optional "title" after the target
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _prose(text: str) -> str:
    """The text without fenced blocks and code spans: a path in code is no link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor; a repeated heading gets -1, -2, ... as GitHub numbers them."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", text)):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    """'page: target (why)' for each relative link that reaches no file or no heading."""
    text = page.read_text(encoding="utf-8")
    problems = []
    for target in LINK.findall(_prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not a relative link
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(ROOT)}: {target}"
        if not dest.exists():
            problems.append(f"{where} (no such file)")
        elif ROOT.resolve() not in dest.parents and dest != ROOT.resolve():
            problems.append(f"{where} (outside the repository)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text("utf-8")):
            problems.append(f"{where} (no such heading)")
    return problems


def test_every_relative_link_in_the_readme_and_docs_resolves():
    problems = [p for page in _pages() for p in broken_links(page)]
    assert not problems, "\n".join(problems)


def test_the_link_check_sees_what_it_must(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    monkeypatch.setattr(sys.modules[__name__], "ROOT", root)
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.md").write_text("# A\n\n## Its `--flag` (two), here\n")
    (tmp_path / "x.md").write_text("# outside\n")
    page = root / "README.md"
    page.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#its---flag-two-here) [ok](#top) ![img](docs/)\n"
        "[gone](docs/b.md) [bad anchor](docs/a.md#nope) [up](../x.md)\n"
        "`[code](nowhere.md)`\n\n```\n[fenced](nowhere.md)\n```\n\n# Top\n"
        "[web](https://example.com/x.md)\n"
    )
    assert broken_links(page) == [
        "README.md: docs/b.md (no such file)",
        "README.md: docs/a.md#nope (no such heading)",
        "README.md: ../x.md (outside the repository)",
    ]


def test_the_readme_is_the_newcomers_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)
    assert lines[:5] == [  # the two commands come first: they are all the set-up there is
        "# autok",
        "",
        "```",
        "make train   # creates .venv on first use, installs autok, runs the default job",
        "make test    # same set-up, runs the test suite (about 23 minutes on 2 cores)",
    ]


@pytest.mark.dist
def test_the_readmes_sync_loop_runs_under_torchrun(tmp_path):
    """The README's `autok.Sync` loop, as printed, at world 2 (its own process group, the
    emulated WAN, exposed-sync): it runs to `sync.close()` on both ranks."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"```python\n(# sync_demo\.py.*?)```", readme, re.DOTALL)
    assert found, "the README's autok.Sync loop (a block starting `# sync_demo.py`)"
    script = tmp_path / "sync_demo.py"
    script.write_text(found.group(1))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    res = subprocess.run(
        [*cmd, str(script)], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
