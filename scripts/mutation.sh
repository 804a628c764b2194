#!/usr/bin/env bash
# Mutation testing lane (issue 36; not CI): mutmut 3 over one module's lane or all of them, each with its
# narrowest tests; prints the score and the surviving mutants.
#
#   scripts/mutation.sh plan            # one lane: training rl-advantages run plan parallel interop serve serve-app v1 serve-guards lora gguf gguf-config gguf-tokenizer gguf-read
#   scripts/mutation.sh                 # every lane, one after another
#   scripts/mutation.sh training 'gptforge.training.ppo.x_make_experience*'   # some functions of one lane
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
FILTER=()
if [ $# -gt 0 ]; then
  [[ " $LANES " == *" $1 "* ]] || { echo "unknown lane $1 (lanes: $LANES)" >&2; exit 2; }
  LANES=$1; shift
  FILTER=("$@")  # mutant-name globs (mutmut's own), e.g. 'gptforge.training.ppo.x_gae*'
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
# forkserver: torch's threads and the serve tests' event loops are not fork-safe after a test run
lines = ["[mutmut]", "source_paths=src/", "process_isolation=forkserver", "only_mutate=",
         *[f"    {p}" for p in cfg["mutate"]],
         "pytest_add_cli_args=", "    -p", "    no:cacheprovider", "    -q",
         "pytest_add_cli_args_test_selection=", *[f"    {p}" for p in cfg["tests"]], ""]
open(f"{work}/setup.cfg", "w").write("\n".join(lines))
PY
  echo "== lane $lane: $(tr '\n' ' ' < "$work/setup.cfg" | sed 's/  */ /g')"
  start=$(date +%s)
  (cd "$work" && nice -n 10 "$MUTMUT" run --max-children "$JOBS" "${FILTER[@]}" > "$work/run.log" 2>&1) || {
    echo "mutmut failed for lane $lane; last lines of $work/run.log:"; tail -20 "$work/run.log"; exit 1; }
  secs=$(( $(date +%s) - start ))
  (cd "$work" && "$MUTMUT" export-cicd-stats >/dev/null && "$MUTMUT" results --all true > results.txt 2>&1 || true)
  "$PY" - "$work" "$lane" "$secs" "${#FILTER[@]}" <<'PY'
import json, sys
work, lane, secs, filtered = sys.argv[1:]
s = json.load(open(f"{work}/mutants/mutmut-cicd-stats.json"))
judged = s["killed"] + s["survived"]
score = 100 * s["killed"] / judged if judged else float("nan")
other = s["killed"] + s["survived"] + sum(s.get(k, 0) for k in ("timeout", "no_tests", "skipped", "suspicious"))
print(f"lane {lane}: {s['total']} mutants ({s['total'] - other} not run: outside the filter), {s['killed']} killed, {s['survived']} survived, "
      f"{s.get('timeout', 0)} timeout, {s.get('no_tests', 0)} no tests, {s.get('skipped', 0)} skipped, "
      f"{s.get('suspicious', 0)} suspicious -> score {score:.1f}% in {secs}s")
print("surviving (and untested) mutants (see one: cd " + work + " && mutmut show NAME):")
for line in open(f"{work}/results.txt"):
    if ": survived" in line or (": no tests" in line and filtered == "0"):
        print("  " + line.strip())
PY
done
