"""The README's two commands and .ci/run stay in step."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command_verbatim():
    blocks = re.findall(r"```\n(.*?)\n```", (REPO / "README.md").read_text(), re.DOTALL)
    setup_and_run, tests = blocks[0].strip(), blocks[1].strip()
    assert "edgeplan run" in setup_and_run and ".venv" in setup_and_run
    assert tests in (REPO / ".ci" / "run").read_text().splitlines()
