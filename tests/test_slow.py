"""Long runs, outside the default suite: `make test ARGS="-m slow"`."""

from __future__ import annotations

import json

import pytest

from tests.test_cli import autok

pytestmark = pytest.mark.slow


def test_default_job_reaches_useful_accuracy(tmp_path):
    res = autok("train", "--no-progress", "--out", str(tmp_path / "r"), timeout=900)
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["peak_test_accuracy"] >= 0.85
    assert len(set(summary["param_digest_per_rank"])) == 1
