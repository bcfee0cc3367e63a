#!/bin/bash
# CPU time per request of a running mini_triton (the server process and its first
# worker process, e.g. a process-mode Python model's), under one perf_analyzer run.
#
#   perf/cpu_per_request.sh HTTP_PORT http|grpc CONCURRENCY [MODEL]
#
# The server is found by its --http-port; requests are counted from the model's
# statistics (success count), CPU from /proc (utime + stime).
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
PORT=$1; PROTOCOL=$2; CONCURRENCY=$3; MODEL=${4:-identity_py}
SERVER=$(for p in $(pgrep -f "mini_triton .*--http-port $PORT"); do
  [ "$(cat /proc/$p/comm)" = python ] && echo $p; done | head -1)
WORKER=$(pgrep -P "$SERVER" | head -1)
ticks() { [ -n "$1" ] && awk '{print $14 + $15}' "/proc/$1/stat" || echo 0; }
count() { curl -s "127.0.0.1:$PORT/v2/models/$MODEL/stats" | python3 -c \
  "import json,sys;print(json.load(sys.stdin)['model_stats'][0]['inference_stats']['success']['count'])"; }
target=$PORT; [ "$PROTOCOL" = grpc ] && target=$((PORT + 1))  # gRPC on HTTP port + 1
n0=$(count); s0=$(ticks "$SERVER"); w0=$(ticks "$WORKER")
out=$("$HERE/perf/perf_analyzer" -m "$MODEL" -u "127.0.0.1:$target" -i "$PROTOCOL" \
  --concurrency-range "$CONCURRENCY" -p 3000 -s 50 -r 3 --shape INPUT0:16 2>&1)
s1=$(ticks "$SERVER"); w1=$(ticks "$WORKER"); n=$(( $(count) - n0 ))
hz=$(getconf CLK_TCK)
echo "$PROTOCOL c$CONCURRENCY: $(echo "$out" | grep '^Concurrency:' | grep -o 'throughput: [0-9.]*') infer/s;" \
  "$n requests; server $(( (s1 - s0) * 1000000 / hz / n )) us CPU/request;" \
  "worker $(( (w1 - w0) * 1000000 / hz / n )) us CPU/request"
