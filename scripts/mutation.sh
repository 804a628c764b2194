#!/usr/bin/env bash
# Mutation testing lane (issue 36; not CI): mutmut 3 over one module's lane or all of them, each with its
# narrowest tests; prints the score and the surviving mutants.
#
#   scripts/mutation.sh plan            # one lane: training run plan parallel interop serve
#   scripts/mutation.sh                 # every lane, one after another
#   MUTATION_JOBS=2 MUTATION_DIR=/tmp/mut scripts/mutation.sh serve
#
# The lanes (files to mutate, tests to run) are [tool.gptforge-mutation.*] in pyproject.toml. Each runs in
# a copy of src/, tests/ and pyproject.toml under $MUTATION_DIR (mutmut writes mutants/ beside its
# config), so the working tree is never touched. Inspect one mutant afterwards with
#   cd $MUTATION_DIR/<lane> && ../../path/to/.venv/bin/mutmut show <name>
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
MUTMUT=${MUTMUT:-$(dirname "$PY")/mutmut}
JOBS=${MUTATION_JOBS:-2}
BASE=${MUTATION_DIR:-${TMPDIR:-/tmp}/gptforge-mutation}
command -v "$MUTMUT" >/dev/null || { echo "mutmut not found: pip install -e '.[dev]' (mutmut>=3)" >&2; exit 2; }
LANES=$("$PY" -c "import tomllib; print(' '.join(tomllib.load(open('$ROOT/pyproject.toml','rb'))['tool']['gptforge-mutation']))")
if [ $# -gt 0 ]; then
  for l in "$@"; do [[ " $LANES " == *" $l "* ]] || { echo "unknown lane $l (lanes: $LANES)" >&2; exit 2; }; done
  LANES="$*"
fi

for lane in $LANES; do
  work="$BASE/$lane"
  rm -rf "$work" && mkdir -p "$work"
  cp -r "$ROOT/src" "$ROOT/tests" "$work/"
  find "$work" -name __pycache__ -prune -exec rm -rf {} +
  # the lane's config as setup.cfg; the copy's pyproject keeps everything but [tool.mutmut]
  "$PY" - "$ROOT/pyproject.toml" "$work" "$lane" <<'PY'
import re, sys, tomllib
src, work, lane = sys.argv[1:]
text = open(src).read()
cfg = tomllib.loads(text)["tool"]["gptforge-mutation"][lane]
text = re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[)", "", text)
open(f"{work}/pyproject.toml", "w").write(text)
lines = ["[mutmut]", "source_paths=src/", "only_mutate=", *[f"    {p}" for p in cfg["mutate"]],
         "pytest_add_cli_args=", "    -p", "    no:cacheprovider", "    -q",
         "pytest_add_cli_args_test_selection=", *[f"    {p}" for p in cfg["tests"]], ""]
open(f"{work}/setup.cfg", "w").write("\n".join(lines))
PY
  echo "== lane $lane: $(tr '\n' ' ' < "$work/setup.cfg" | sed 's/  */ /g')"
  start=$(date +%s)
  (cd "$work" && nice -n 10 "$MUTMUT" run --max-children "$JOBS" > "$work/run.log" 2>&1) || {
    echo "mutmut failed for lane $lane; last lines of $work/run.log:"; tail -20 "$work/run.log"; exit 1; }
  secs=$(( $(date +%s) - start ))
  (cd "$work" && "$MUTMUT" export-cicd-stats >/dev/null && "$MUTMUT" results --all true > results.txt 2>&1 || true)
  "$PY" - "$work" "$lane" "$secs" <<'PY'
import json, sys
work, lane, secs = sys.argv[1:]
s = json.load(open(f"{work}/mutants/mutmut-cicd-stats.json"))
judged = s["killed"] + s["survived"]
score = 100 * s["killed"] / judged if judged else float("nan")
print(f"lane {lane}: {s['total']} mutants, {s['killed']} killed, {s['survived']} survived, "
      f"{s.get('timeout', 0)} timeout, {s.get('no_tests', 0)} no tests, {s.get('skipped', 0)} skipped, "
      f"{s.get('suspicious', 0)} suspicious -> score {score:.1f}% in {secs}s")
print("surviving (and untested) mutants:")
for line in open(f"{work}/results.txt"):
    if ": survived" in line or ": no tests" in line:
        print("  " + line.strip())
PY
done
