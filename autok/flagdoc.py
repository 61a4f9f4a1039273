"""Writes the flag tables of docs/flags.md from `autok train --help` (`python -m autok.flagdoc`;
`--check` exits 1 when the committed file differs from what this writes).

The tables are read from the parser, which reads each setting's field (its help line, group and
default: trainer/engine/options.py `about`), so a flag is described in one place and the page
cannot drift from `--help` (docs/design.md §3). Only the text between the two markers is
written; the prose around them is the page's own. A tool of the checkout, as
dashboards/build.py is: nothing of autok imports it.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from autok.cli import build_parser

PAGE = Path(__file__).resolve().parents[1] / "docs" / "flags.md"
BEGIN = "<!-- flag tables: written by `python -m autok.flagdoc` from the settings; do not edit -->"
END = "<!-- end of flag tables -->"
# "... (default: X)" at the end of a help line: X goes to the default column
DEFAULT = re.compile(r"\s*\(default: (.*)\)$")


def train_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["train"]


def row(action: argparse.Action) -> str:
    """One table row: the flag (both spellings of a boolean), its default, its meaning."""
    text = " ".join((action.help or "").replace("%%", "%").split())
    found = DEFAULT.search(text)
    default = f"`{found.group(1)}`" if found else "—"
    meaning = text[: found.start()] if found else text
    flags = ", ".join(f"`{o}`" for o in action.option_strings)
    return f"| {flags} | {cell(default)} | {cell(meaning)} |"


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def tables() -> str:
    """Every `autok train` flag, a table per group of `--help`, in its order."""
    out: list[str] = []
    for group in train_parser()._action_groups:
        actions = [a for a in group._group_actions if a.option_strings and a.dest != "help"]
        if not actions:
            continue
        title = group.title or ""
        out += [f"### {title[:1].upper()}{title[1:]}", ""]
        out += ["| flag | default | meaning |", "|---|---|---|"]
        out += [row(a) for a in actions]
        out.append("")
    return "\n".join(out)


def render(page: str) -> str:
    """`page` with the text between BEGIN and END replaced by the tables."""
    head, begin, rest = page.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"{PAGE}: the markers {BEGIN!r} and {END!r} are missing")
    return f"{head}{BEGIN}\n\n{tables()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m autok.flagdoc", description=f"write the flag tables of {PAGE}"
    )
    parser.add_argument("--check", action="store_true", help="compare only; write nothing")
    args = parser.parse_args(argv)  # an unknown argument: exit 2, nothing written
    try:
        text = render(page := PAGE.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # no checkout's docs/ (an installed autok), no markers
        print(f"autok.flagdoc: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if page != text:
            print(f"{PAGE} is stale: run python -m autok.flagdoc", file=sys.stderr)
            return 1
        return 0
    if PAGE.is_symlink():  # never write through a link (docs/design.md §9)
        print(f"{PAGE} is a symbolic link; not written", file=sys.stderr)
        return 1
    PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
