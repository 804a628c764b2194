"""scripts/setup.sh (run by the default job every time) reinstalls the package only when
pyproject.toml or the extras changed: a stand-in venv records what pip was asked to do."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_second_setup_with_nothing_changed_does_not_reinstall(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", repo / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    (repo / "src").symlink_to(ROOT / "src")
    log = tmp_path / "calls.log"
    venv = repo / ".venv" / "bin"
    venv.mkdir(parents=True)
    # python: pip calls are logged, torch is taken as present; anything else runs the real interpreter on this checkout's sources
    (venv / "python").write_text(f"""#!/usr/bin/env bash
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "pip $*" >> {log}; exit 0; fi
if [ "$1" = "-c" ] && [ "$2" = "import torch" ]; then exit 0; fi  # torch is there (and slow to import)
PYTHONPATH={repo}/src exec {sys.executable} "$@"
""")
    (venv / "gptforge").write_text(f"#!/usr/bin/env bash\necho \"gptforge $*\" >> {log}\n")
    for f in ("python", "gptforge"):
        (venv / f).chmod(0o755)

    def setup(extras: str = "") -> list[str]:
        log.write_text("")
        env = {**os.environ, "EXTRAS": extras}
        subprocess.run(["bash", str(repo / "scripts" / "setup.sh")], check=True, env=env, capture_output=True,
                       timeout=60)
        return [ln for ln in log.read_text().splitlines() if ln.startswith("pip") and "install" in ln]

    assert len(setup()) == 1  # the first time: installed
    assert setup() == []  # nothing changed: no pip at all
    assert len(setup("dev")) == 1  # other extras: installed again
    with open(repo / "pyproject.toml", "a") as f:
        f.write("\n# a new dependency would change this file\n")
    assert len(setup("dev")) == 1
    assert setup("dev") == []
