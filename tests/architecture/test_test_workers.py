"""The suite runs in test workers (``pytest-xdist``, see ``pyproject.toml``): what
``tests/conftest.py`` does so that a worker's report always reaches the controller."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import gevent.monkey
import pytest

SURROGATE_SUITE = """
import logging

def test_logs_a_lone_surrogate():
    logging.getLogger("subagents").error("turn failed: bad \\ud800")
    print("printed: \\udcff")

def test_fails_with_one():
    raise AssertionError("\\ud800 in the failure")
"""


@pytest.mark.skipif(gevent.monkey.is_module_patched("threading"), reason="no workers patched")
def test_a_report_with_a_lone_surrogate_reaches_the_controller(tmp_path: Path) -> None:
    """A test whose captured log, output or failure holds a lone surrogate (a turn
    that failed with one in its exception logs it) is reported like any other: the
    worker sends it with the surrogate escaped instead of ending with an encoding
    error (INTERNALERROR) and taking the rest of its tests with it."""
    shutil.copy(Path(__file__).parents[1] / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_surrogates.py").write_text(textwrap.dedent(SURROGATE_SUITE))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "-rA"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        errors="backslashreplace",
        timeout=120,
        check=False,
    )
    output = f"{proc.stdout}\n{proc.stderr}"
    assert "INTERNALERROR" not in output, output
    assert "1 failed, 1 passed" in proc.stdout, output
    assert "\\ud800 in the failure" in proc.stdout, output
