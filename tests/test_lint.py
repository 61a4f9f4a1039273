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
