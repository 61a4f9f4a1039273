import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed (it is in the dev extra)")
    res = subprocess.run([ruff, "check", str(ROOT)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout
    # the formatter too: a `# fmt: skip` where ruff does not read one let two files drift
    res = subprocess.run([ruff, "format", "--check", str(ROOT)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


# ----- the layers (docs/design.md §3): controllers <- engine <- built-in loop <- autok's commands


def _imports(path: Path) -> set[str]:
    """Every module `path` imports at run time, at any depth (imports inside functions too);
    `if TYPE_CHECKING:` blocks are for the type checker only and are skipped."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for n in ast.walk(stmt)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from trainer import tasks` imports trainer.tasks: record both readings
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def _violations(files: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    """`forbidden`: packages (the package and its modules), or "pkg." for its modules only."""
    return sorted(
        f"{f.relative_to(ROOT)} imports {m}"
        for f in files
        for m in _imports(f)
        if any(m.startswith(p) if p.endswith(".") else m == p or m.startswith(p + ".")
               for p in forbidden)
    )  # fmt: skip


# Each installed package, the repository folder it ships from, and the packages of autok's own it
# may import. A module's layer is its package's: the test reads folders, not a list of modules.
LAYERS = {
    "autok.controllers": ("controllers", ("autok.controllers",)),
    "autok.trainer.engine": ("trainer/engine", ("autok.controllers", "autok.trainer.engine")),
    "autok.trainer.loop": (
        "trainer/loop",
        ("autok.controllers", "autok.trainer.engine", "autok.trainer.loop"),
    ),
}
# the names no installed module imports: the old top-level names, and the uninstalled harness
NEVER = ("trainer", "controllers", "benchmarks")


def _own(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in ("autok", *NEVER))


def _layer_violations(package: str) -> list[str]:
    folder, allowed = LAYERS[package]
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, folder
    return sorted(
        f"{f.relative_to(ROOT)} imports {m}"
        for f in files
        for m in _imports(f)
        if _own(m) and not any(m == a or m.startswith(a + ".") for a in allowed)
    )


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_the_layers_import_one_way_only(package):
    assert not _layer_violations(package)


def test_the_controllers_are_pure_decision_logic():
    assert not _violations(sorted((ROOT / "controllers").rglob("*.py")), ("torch.distributed",))


def test_every_module_of_trainer_sits_in_a_layer():
    """A new module or subpackage of trainer/ goes in the engine or the loop, not beside them."""
    loose = [p.name for p in (ROOT / "trainer").iterdir()
             if p.name not in ("__init__.py", "__pycache__", "engine", "loop")]  # fmt: skip
    assert not loose


def test_no_installed_module_imports_the_old_top_level_names():
    folders = ("autok", "trainer", "controllers")
    files = [f for folder in folders for f in (ROOT / folder).rglob("*.py")]
    # one exception: `autok bench` imports the checkout's benchmarks/ once it has found one
    bench = {f"autok/cli.py imports benchmarks.bench_cli{m}" for m in ("", ".main")}
    assert set(_violations(files, NEVER)) == bench


def test_the_layer_check_sees_a_violation():
    # the scan reads package names: an engine module that imports the loop is caught
    engine = LAYERS["autok.trainer.engine"][1]
    assert not any("autok.trainer.loop.run".startswith(a + ".") for a in engine)
    assert _own("autok.trainer.loop.run") and _own("benchmarks.engine") and not _own("autokx")


def test_examples_use_the_public_api_only():
    examples = sorted((ROOT / "examples").rglob("*.py"))
    assert len(examples) >= 3
    assert not _violations(examples, (*NEVER, "autok."))
    with_code = [f for f in examples if f.stat().st_size]
    assert with_code and all("autok" in _imports(f) for f in with_code)


def test_the_import_scan_sees_what_it_must():
    # lazy imports inside functions count; TYPE_CHECKING-only ones do not
    assert "autok.trainer.loop.tasks" in _imports(ROOT / "autok" / "config.py")
    assert "autok.launch" in _imports(ROOT / "autok" / "api.py")  # inside __init__
    assert "autok.config" not in _imports(ROOT / "trainer" / "loop" / "run.py")
    assert _violations([ROOT / "autok" / "cli.py"], ("autok.trainer",))
    assert _violations([ROOT / "autok" / "api.py"], ("autok.",))  # autok.config, autok.launch
    assert not _violations([ROOT / "autok" / "api.py"], ("auto",))  # whole names only
    assert "autok.trainer.loop.tasks" in _imports(ROOT / "trainer" / "loop" / "run.py")


# ----- citations: comments cite docs/design.md by its own sections, never issue numbers ----------

CITING = ("autok", "trainer", "controllers")  # the packages held to it
# The founding card outside the repository ("DESIGN §N", "DESIGN.md"): its numbering is not
# docs/design.md's, so a reader of the repository cannot follow it.
OUTSIDE_DESIGN = re.compile(r"\bDESIGN\b")
# "issue 17", "Issue #41", "issue 15's goals": a number that says nothing in the code itself.
ISSUE_NUMBER = re.compile(r"\bissue\s*#?\s*\d+", re.IGNORECASE)
# "(#23)": in comments and docstrings only (a string may hold a colour, "#000000"); another
# project's issue ("pytorch#76282") is a reference, not this project's number.
HASH_NUMBER = re.compile(r"(?<![\w/])#\d+\b")
# "docs/design.md §4", "design.md §7, §3", "docs/design.md §5 and §4", across comment lines too.
DESIGN_CITE = re.compile(r"design\.md\s*§\s*(\d+)((?:\s*(?:,|and|or)\s*§\s*\d+)*)")


def _design_sections() -> set[int]:
    """The numbers of docs/design.md's sections (its "## N. Title" headings)."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    return {int(n) for n in re.findall(r"^## (\d+)\. ", text, re.MULTILINE)}


def _comments(source: str) -> list[tuple[int, str]]:
    """(first line, text) of each run of comments on consecutive lines, joined line by line, so
    that a citation wrapped from one comment line to the next reads whole."""
    blocks: list[tuple[int, str]] = []
    last = -1
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        line, text = tok.start[0], tok.string.lstrip("#").strip()
        if blocks and line == last + 1:
            blocks[-1] = (blocks[-1][0], f"{blocks[-1][1]}\n{text}")
        else:
            blocks.append((line, text))
        last = line
    return blocks


def _strings(source: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(line, text) of the docstrings, and of every other string literal (user-visible text)."""
    tree = ast.parse(source)
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    doc_ids = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, owners) and node.body and isinstance(node.body[0], ast.Expr)
    }
    docs: list[tuple[int, str]] = []
    others: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            (docs if id(node) in doc_ids else others).append((node.lineno, node.value))
    return docs, others


def citation_problems(source: str, sections: set[int]) -> list[str]:
    """'line: what' for each issue number, citation of the outside design card, or
    docs/design.md section that does not exist, in `source`'s comments and strings."""
    comments = _comments(source)
    docs, others = _strings(source)
    problems: list[str] = []

    def at(line: int, text: str, m: re.Match[str]) -> int:  # the match's own line
        return line + text.count("\n", 0, m.start())

    for line, text in comments + docs:
        for m in HASH_NUMBER.finditer(text):
            problems.append(f"{at(line, text, m)}: an issue number {m.group(0)!r}")
    for line, text in comments + docs + others:
        for m in ISSUE_NUMBER.finditer(text):
            problems.append(f"{at(line, text, m)}: an issue number {m.group(0)!r}")
        for m in OUTSIDE_DESIGN.finditer(text):
            problems.append(f"{at(line, text, m)}: cites the outside DESIGN card")
        for m in DESIGN_CITE.finditer(text):
            cited = {int(m.group(1)), *map(int, re.findall(r"\d+", m.group(2)))}
            problems += [
                f"{at(line, text, m)}: docs/design.md has no §{n}" for n in sorted(cited - sections)
            ]
    return sorted(problems, key=lambda p: int(p.split(":")[0]))


def test_comments_cite_docs_design_by_its_own_sections_and_no_issue_numbers():
    # docs/design.md §10 lists how it differs from the founding card; code cites it alone
    sections = _design_sections()
    assert len(sections) >= 9 and sections == set(range(1, max(sections) + 1)), sections
    found = [
        f"{path.relative_to(ROOT)}:{problem}"
        for package in CITING
        for path in sorted((ROOT / package).rglob("*.py"))
        for problem in citation_problems(path.read_text(encoding="utf-8"), sections)
    ]
    assert not found, "\n".join(found)


def test_the_citation_scan_sees_what_it_must():
    sections = {1, 2, 3}
    bad = [
        "# see DESIGN §2\nx = 1\n",
        '"""The engine (DESIGN.md)."""\n',
        'def f():\n    """Made cheaper for issue 17."""\n',
        'class C:\n    """Issue #41\'s case."""\n',
        "x = 1  # (issue 15's goals)\n",
        "# a change (#23)\n",
        'HEADING = "The goals of issue 15"\n',
        "# the layers (docs/design.md §4)\n",
        "x = 1  # split across lines (docs/design.md\n# §7, Report)\n",
        "# (docs/design.md §2, §9)\n",
        "# (docs/design.md §2 and §9)\n",
    ]
    for source in bad:
        assert citation_problems(source, sections), source
    good = (
        '"""The engine (docs/design.md §3, Public API; §1, §2)."""\n'
        "# every rank issues 2 collectives; the issue's goal; pytorch#76282\n"
        'COLOUR = "#000000"  # (docs/design.md §2 and §3; design.md §1)\n'
        "def f():\n"
        '    """A design choice, docs/design.md, "Overlap"."""\n'
    )
    assert citation_problems(good, sections) == []


# ----- the type check: `make lint` runs mypy (the run itself is CI's `make lint`: ~80 s cold) ---


def test_make_lint_type_checks_every_installed_package_and_ci_runs_it():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    mypy = project["tool"]["mypy"]
    # one installed top-level package, autok, read as the wheel lays it out: each folder that
    # ships under another name (package-dir) is linked in by that name, but the data and examples
    installed = {p.split(".")[0] for p in project["tool"]["setuptools"]["packages"]}
    assert installed == {"autok"} and mypy["files"] == [".typecheck/autok"]
    assert mypy["check_untyped_defs"] is True
    recipe = re.search(r"^lint:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe and re.search(r"^\t\$\(BIN\)/mypy\s*$", recipe.group(1), re.MULTILINE)
    mapped = project["tool"]["setuptools"]["package-dir"]
    code = {n: d for n, d in mapped.items() if n not in ("autok.experiments", "autok.dashboards",
                                                          "autok.examples")}  # fmt: skip
    assert code == {"autok.trainer": "trainer", "autok.controllers": "controllers"}
    for name, folder in code.items():
        link = f"ln -s $(CURDIR)/{folder} $(TYPECHECK)/{name.split('.', 1)[1]}"
        assert link in recipe.group(1)
    assert re.search(r"^make lint\b", (ROOT / ".ci" / "run").read_text(), re.MULTILINE)
    assert ".mypy_cache/" in (ROOT / ".gitignore").read_text().splitlines()


def test_no_installed_module_is_exempt_from_the_type_check():
    """Every installed module is checked with every error code: the overrides may only type
    third-party packages without stubs as Any and leave benchmarks/ (not installed) unchecked."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    for override in project["tool"]["mypy"].get("overrides", []):
        modules = override["module"]
        modules = [modules] if isinstance(modules, str) else modules
        ours = [m for m in modules if m.split(".")[0] == "autok"]
        assert not ours, f"{ours}: exempt from the type check ({sorted(override)})"
