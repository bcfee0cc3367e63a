#!/bin/bash
# Measure two source trees of mini_triton against each other, alternately, in one run.
#
#   git worktree add /tmp/mt-before <commit>        # the "before" tree
#   perf/ab_compare.sh /tmp/mt-before . "http:1 http:16 grpc:1 grpc:16" 3
#
# Starts both servers on perf/repos/python_identity (MINI_TRITON_PYTHON_EXECUTION_MODE
# applies to both), then for each repetition and point runs perf_analyzer on one and
# then the other (the order flips every repetition) and prints infer/s for both.
# MEASURE=cpu prints perf/cpu_per_request.sh's line instead (infer/s and the server's
# and worker's CPU time per request), a steadier figure on a shared machine.
# BEFORE_ARGS / AFTER_ARGS add server flags to one side, e.g. the same tree twice:
#   BEFORE_ARGS="--grpc-transport grpcio" perf/ab_compare.sh . . "grpc:1 grpc:16" 2
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
BEFORE=$(cd "$1" && pwd); AFTER=$(cd "$2" && pwd); POINTS=$3; REPS=${4:-3}
REPO=${REPO:-$HERE/perf/repos/python_identity}; MODEL=${MODEL:-identity_py}
PY=$HERE/.venv/bin/python
start() {  # tree port [flags]
  (cd "$1" && PYTHONPATH="$1" exec "$PY" -m mini_triton --model-repository "$REPO" \
     --http-port "$2" --grpc-port $(($2 + 1)) --metrics-port $(($2 + 2)) ${3:-}) >/dev/null 2>&1 &
  echo $!
}
wait_ready() {
  for _ in $(seq 1 120); do
    curl -sf "127.0.0.1:$1/v2/models/$MODEL/ready" >/dev/null && return 0; sleep 0.5
  done
  echo "server on $1 not ready" >&2; return 1
}
run() {  # port protocol concurrency
  if [ "${MEASURE:-}" = cpu ]; then
    bash "$HERE/perf/cpu_per_request.sh" "$1" "$2" "$3" "$MODEL" | sed 's/^[a-z]* c[0-9]*: //'
    return
  fi
  local port=$1; [ "$2" = grpc ] && port=$(($1 + 1))
  "$HERE/perf/perf_analyzer" -m "$MODEL" -u "127.0.0.1:$port" -i "$2" --concurrency-range "$3" \
    -p 2000 -s 30 -r 6 --shape INPUT0:16 2>&1 | grep "^Concurrency:" | grep -o "throughput: [0-9.]*" | cut -d" " -f2
}
A=$(start "$BEFORE" 18200 "${BEFORE_ARGS:-}"); B=$(start "$AFTER" 18300 "${AFTER_ARGS:-}")
trap 'kill $A $B 2>/dev/null' EXIT
wait_ready 18200 && wait_ready 18300 || exit 1
echo "| rep | protocol | concurrency | before infer/s | after infer/s |"
echo "|---|---|---|---|---|"
for rep in $(seq 1 "$REPS"); do
  for point in $POINTS; do
    protocol=${point%:*}; c=${point#*:}
    if [ $((rep % 2)) = 1 ]; then a=$(run 18200 "$protocol" "$c"); b=$(run 18300 "$protocol" "$c")
    else b=$(run 18300 "$protocol" "$c"); a=$(run 18200 "$protocol" "$c"); fi
    echo "| $rep | $protocol | $c | $a | $b |"
  done
done
