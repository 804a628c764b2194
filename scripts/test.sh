#!/usr/bin/env bash
# The test suite: install (scripts/setup.sh), then the fast CPU pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the allocator gptforge itself picks (issue 35): tcmalloc-minimal where installed keeps torch's big CPU
# blocks instead of mapping and faulting them in every step; most tests run gptforge in this process,
# so it is preloaded here (GPTFORGE_ALLOCATOR=system opts out; the browser tests start Chromium without it)
if [ "${GPTFORGE_ALLOCATOR:-auto}" != system ] && [ -z "${LD_PRELOAD:-}" ]; then
  TCMALLOC=$(.venv/bin/python -c "from gptforge.allocator import find_tcmalloc; print(find_tcmalloc() or '')")
  [ -n "$TCMALLOC" ] && export LD_PRELOAD=$TCMALLOC
fi
# bytecode caches on: with PYTHONDONTWRITEBYTECODE set (as on the 2-core dev machine) every pytest worker and every
# gptforge subprocess the tests start compiled and assertion-rewrote the whole tree again: ~8 of each worker's
# ~18 s of collection (__pycache__/ is git-ignored)
unset PYTHONDONTWRITEBYTECODE
# one pytest worker per core, up to 4 (pytest-xdist); whole files to a worker, so a module's shared fixtures
# (one torchrun launch serving several checks) run once. GPTFORGE_TEST_WORKERS=0 runs in this one process.
WORKERS=${GPTFORGE_TEST_WORKERS:-$(n=$(nproc); echo $(( n < 4 ? n : 4 )))}
exec .venv/bin/python -m pytest -q -n "$WORKERS" --dist loadfile "$@"
