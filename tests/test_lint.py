import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed (it is in the dev extra)")
    res = subprocess.run([ruff, "check", str(ROOT)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


# ----- the layers (DESIGN §2): controllers <- engine <- built-in loop and tasks <- autok ---------

ENGINE = {  # trainer/ modules that make up `Sync`; the rest of trainer/ is the built-in loop
    "sync", "averaging", "grad_hook", "link", "options", "optim", "profiler", "slowmo",
    "strategies", "divergence", "fragments",
}  # fmt: skip


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


def test_the_layers_import_one_way_only():
    controllers = sorted((ROOT / "controllers").glob("*.py"))
    assert controllers and not _violations(
        controllers, ("torch.distributed", "trainer", "autok", "benchmarks")
    )
    engine = [ROOT / "trainer" / f"{m}.py" for m in sorted(ENGINE)]
    loop_only = (
        "trainer.loop", "trainer.tasks", "trainer.data", "trainer.models", "trainer.sinks",
        "trainer.checkpoint",
    )  # fmt: skip
    assert not _violations(engine, ("autok", "benchmarks", *loop_only))
    trainer = sorted((ROOT / "trainer").glob("*.py"))
    assert not _violations(trainer, ("autok", "benchmarks"))  # the loop never imports the CLI


def test_examples_use_the_public_api_only():
    examples = sorted((ROOT / "examples").rglob("*.py"))
    assert len(examples) >= 3
    assert not _violations(examples, ("trainer", "controllers", "benchmarks", "autok."))
    with_code = [f for f in examples if f.stat().st_size]
    assert with_code and all("autok" in _imports(f) for f in with_code)


def test_the_import_scan_sees_what_it_must():
    # lazy imports inside functions count; TYPE_CHECKING-only ones do not
    assert "trainer.tasks" in _imports(ROOT / "autok" / "config.py")
    assert "autok.launch" in _imports(ROOT / "autok" / "api.py")  # inside __init__
    assert "autok.config" not in _imports(ROOT / "trainer" / "loop.py")
    assert _violations([ROOT / "autok" / "cli.py"], ("trainer",))
    assert _violations([ROOT / "autok" / "api.py"], ("autok.",))  # autok.config, autok.launch
    assert not _violations([ROOT / "autok" / "api.py"], ("auto",))  # whole names only
    assert "trainer.tasks" in _imports(ROOT / "trainer" / "loop.py")
