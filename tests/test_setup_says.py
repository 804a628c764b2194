"""scripts/setup.sh says what it installs before pip starts, and lets pip show its progress (issue 55: a
silent ``pip install -q`` for about two minutes). A stand-in venv's pip prints a marker, so the order of
the lines is the order of the events."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("bash") is None or sys.version_info < (3, 11), reason="needs bash and tomllib")
@pytest.mark.parametrize("torch_there", [True, False])
def test_setup_names_what_it_installs_before_pip_runs(tmp_path, torch_there):
    import tomllib

    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", repo / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    (repo / "src").symlink_to(ROOT / "src")
    venv = repo / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(f"""#!/usr/bin/env bash
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "PIP $*"; exit 0; fi
if [ "$1" = "-c" ] && [ "$2" = "import torch" ]; then exit {0 if torch_there else 1}; fi
PYTHONPATH={repo}/src exec {sys.executable} "$@"
""")
    (venv / "gptforge").write_text("#!/usr/bin/env bash\ntrue\n")
    for f in ("python", "gptforge"):
        (venv / f).chmod(0o755)
    out = subprocess.run(["bash", str(repo / "scripts" / "setup.sh")], check=True, capture_output=True, text=True,
                         env={**os.environ, "EXTRAS": "dev", "TORCH_SPEC": "torch==9.9"}, timeout=60).stdout
    lines = out.splitlines()
    pips = [i for i, ln in enumerate(lines) if ln.startswith("PIP ")]
    assert pips and all("-q" not in lines[i].split() for i in pips), lines  # pip's progress is shown
    said = [i for i, ln in enumerate(lines) if ln.startswith("setup: installing")]
    assert len(said) == len(pips) and all(s == p - 1 for s, p in zip(said, pips, strict=True)), lines
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    want = project["dependencies"] + project["optional-dependencies"]["dev"]
    gptforge_line = lines[said[-1]]
    assert gptforge_line.startswith("setup: installing gptforge (editable, extras [dev]) into .venv with: ")
    assert all(d in gptforge_line for d in want), gptforge_line
    if not torch_there:
        assert lines[said[0]].startswith("setup: installing torch==9.9 into .venv") and "torch==9.9" in lines[pips[0]]
