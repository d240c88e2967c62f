#!/usr/bin/env bash
# Runs every documented make target from a fresh clone, in a scratch folder,
# and prints one pass/fail line per target (issue 24: "every documented
# command works on a fresh machine"). Not run by CI: the whole list takes
# hours and downloads several GB.
#
#   tools/fresh_check.sh                      every target `make help` lists, in its order
#   tools/fresh_check.sh --skip-slow          without the very slow ones ($SLOW below)
#   tools/fresh_check.sh --only help,build,release
#   tools/fresh_check.sh --skip test,bench --dir /tmp/fc --keep
#
# The clone is of this checkout's HEAD (committed work only), into
# DIR/spec-verify (default: a new mktemp -d folder); each target's output goes
# to DIR/logs/<target>.log and a failed target prints its log's last line,
# which for a missing tool is the line that names it. The clone is removed at
# the end unless --keep (a kept clone keeps its venvs and .cache/). pip's own
# cache (~/.cache/pip) is shared with the machine: a fresh clone, not a fresh
# machine. Exit status: 0 when every target run passed.
set -uo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
# The very slow or very large ones (emulated suites, the vLLM venv, a 4.2 GB
# torch venv, a llama.cpp source build, the sanitizer suite, the real-model bench).
SLOW="test-aarch64,test-release-aarch64,vllm-env,test-vllm,bench-vllm,llama-native,test-asan,test-torch212,bench-real"
DIR="" ONLY="" SKIP="" KEEP=0

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while (( $# )); do
  case "$1" in
    --only) ONLY="$2"; shift 2 ;;
    --skip) SKIP="${SKIP:+$SKIP,}$2"; shift 2 ;;
    --skip-slow) SKIP="${SKIP:+$SKIP,}$SLOW"; shift ;;
    --dir) DIR="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "fresh_check: unknown argument $1" >&2; usage 2 ;;
  esac
done

[[ -n $DIR ]] || DIR="$(mktemp -d /tmp/spec-verify-fresh.XXXXXX)"
CLONE="$DIR/spec-verify"
LOGS="$DIR/logs"
[[ ! -e $CLONE ]] || { echo "fresh_check: $CLONE exists; give another --dir" >&2; exit 2; }
mkdir -p "$LOGS"

git clone --quiet --no-local "$REPO" "$CLONE" || { echo "fresh_check: git clone of $REPO failed" >&2; exit 2; }
echo "fresh_check: clone of $(git -C "$CLONE" rev-parse --short HEAD) in $CLONE; logs in $LOGS"

# The targets: `make help`'s list, as the clone's Makefile documents them.
mapfile -t ALL < <(make -s -C "$CLONE" help | awk '$1 == "make" { print $2 }')
(( ${#ALL[@]} )) || { echo "fresh_check: make help listed no target" >&2; exit 2; }
in_list() { [[ ",$2," == *",$1,"* ]]; }
if [[ -n $ONLY ]]; then
  for t in ${ONLY//,/ }; do
    printf '%s\n' "${ALL[@]}" | grep -qx -- "$t" || { echo "fresh_check: --only $t: not a target make help lists" >&2; exit 2; }
  done
fi

declare -a RESULTS
failed=0
for t in "${ALL[@]}"; do
  if [[ -n $ONLY ]] && ! in_list "$t" "$ONLY"; then continue; fi
  # clean would undo the targets before it; it is run, but last.
  [[ $t == clean ]] && continue
  if in_list "$t" "$SKIP"; then RESULTS+=("SKIP  make $t"); echo "SKIP  make $t"; continue; fi
  start=$(date +%s)
  if (cd "$CLONE" && nice make "$t") >"$LOGS/$t.log" 2>&1; then
    line="PASS  make $t  ($(( $(date +%s) - start )) s)"
  else
    line="FAIL  make $t  ($(( $(date +%s) - start )) s): $(grep -v '^make\(\[[0-9]*\]\)\?: \*\*\*' "$LOGS/$t.log" | tail -n 1)"
    failed=$((failed + 1))
  fi
  RESULTS+=("$line"); echo "$line"
done
if printf '%s\n' "${ALL[@]}" | grep -qx clean && { [[ -z $ONLY ]] || in_list clean "$ONLY"; } && ! in_list clean "$SKIP"; then
  if (cd "$CLONE" && make clean) >"$LOGS/clean.log" 2>&1; then line="PASS  make clean"; else line="FAIL  make clean"; failed=$((failed + 1)); fi
  RESULTS+=("$line"); echo "$line"
fi

echo "fresh_check: summary (clone $(git -C "$CLONE" rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ))"
printf '  %s\n' "${RESULTS[@]}"
if (( KEEP )); then echo "fresh_check: clone kept in $CLONE"; else rm -rf "$CLONE"; fi
(( failed == 0 ))
