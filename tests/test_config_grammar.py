"""The grammar ships inside the wheel and is found from an installed package as well as from
the source tree."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mini_triton.config.syntax import GRAMMAR_NAME, grammar_path

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_grammar_is_found_in_the_source_tree():
    assert grammar_path() == REPO_ROOT / "grammar" / GRAMMAR_NAME


@pytest.mark.timeout(120)
def test_grammar_is_found_in_an_installed_wheel(tmp_path):
    builders = pytest.importorskip("hatchling.builders.wheel")
    builder = builders.WheelBuilder(str(REPO_ROOT))
    wheel = Path(next(builder.build(directory=str(tmp_path), versions=["standard"])))
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        assert f"mini_triton/grammar/{GRAMMAR_NAME}" in archive.namelist()
        archive.extractall(site)
    # Run away from the source tree, so that only the installed copy can be found.
    script = (
        "from mini_triton.config import parse_config_text\n"
        "from mini_triton.config.syntax import grammar_path\n"
        "print(grammar_path())\n"
        "print(parse_config_text('max_batch_size: 4').max_batch_size)\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r})\n{script}"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    found, value = done.stdout.split()
    assert Path(found) == site / "mini_triton" / "grammar" / GRAMMAR_NAME
    assert value == "4"
