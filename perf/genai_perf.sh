#!/usr/bin/env bash
# NVIDIA genai-perf against our OpenAI routes: /v1/chat/completions, streaming, on the
# bundled text_stream model, at concurrency 1, 4 and 16.
#
#   bash perf/genai_perf.sh            # reports under perf/results/genai-perf/
#
# genai-perf goes in its own venv (perf/.tools/genai-venv: about 1 GB, no torch) and
# drives perf_analyzer (perf/setup_perf_analyzer.sh puts it in perf/.tools/pa-venv).
# It counts tokens with a Hugging Face tokenizer; instead of downloading one, a
# word-level tokenizer of text_stream's own vocabulary is made here
# (perf/.tools/word-tokenizer), so its token counts are text_stream's words.
# Environment: CONCURRENCY (default "1 4 16"), REQUESTS (default 64), TOKENS (default 64).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
TOOLS="$HERE/.tools"
VENV="$TOOLS/genai-venv"
TOKENIZER="$TOOLS/word-tokenizer"
OUT="$HERE/results/genai-perf"
PY="$ROOT/.venv/bin/python"

if [ ! -x "$VENV/bin/genai-perf" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q genai-perf
fi
if [ ! -x "$TOOLS/pa-venv/bin/perf_analyzer" ]; then
    bash "$HERE/setup_perf_analyzer.sh"
fi

if [ ! -f "$TOKENIZER/tokenizer.json" ]; then
    "$VENV/bin/python" - "$ROOT/model_repository/text_stream/1/model.py" "$TOKENIZER" <<'EOF'
import re, sys
from pathlib import Path
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

source, folder = Path(sys.argv[1]).read_text(), Path(sys.argv[2])
text = re.search(r'TEXT = """(.*?)"""', source, re.S).group(1)
words = sorted(set(text.split()) | {"[UNK]"})
tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]").save_pretrained(folder)
EOF
fi

LOG="$(mktemp)"
"$PY" -m mini_triton --model-repository "$ROOT/model_repository" --model-control-mode=explicit \
    --load-model=text_stream --http-port=0 --grpc-port=0 --metrics-port=0 \
    --http-address=127.0.0.1 --grpc-address=127.0.0.1 --metrics-address=127.0.0.1 \
    > "$LOG" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null; rm -f "$LOG"' EXIT
PORT=""
for _ in $(seq 1 120); do
    PORT="$(grep -oE 'Started HTTPService at [^ ]*:[0-9]+' "$LOG" | head -n1 | grep -oE '[0-9]+$' || true)"
    [ -n "$PORT" ] && curl -sf "http://127.0.0.1:$PORT/v2/health/ready" > /dev/null && break
    sleep 0.5
done
[ -n "$PORT" ] || { cat "$LOG"; exit 1; }

export PATH="$TOOLS/pa-venv/bin:$PATH"
CUDART="$(ls -d "$TOOLS"/pa-venv/lib/python3*/site-packages/nvidia/cuda_runtime/lib 2>/dev/null | head -n1)"
export LD_LIBRARY_PATH="${CUDART}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$OUT"
for concurrency in ${CONCURRENCY:-1 4 16}; do
    # perf_analyzer never finishes its warm-up with fewer warm-up requests than clients.
    warmup=$(( concurrency > 4 ? concurrency : 4 ))
    "$VENV/bin/genai-perf" profile -m text_stream --endpoint-type chat --streaming \
        -u "127.0.0.1:$PORT" --tokenizer "$TOKENIZER" --concurrency "$concurrency" \
        --request-count "${REQUESTS:-64}" --warmup-request-count "$warmup" \
        --synthetic-input-tokens-mean 16 --synthetic-input-tokens-stddev 0 \
        --output-tokens-mean "${TOKENS:-64}" --extra-inputs ignore_eos:true \
        --extra-inputs token_interval_ms:0 \
        --artifact-dir "$OUT/concurrency$concurrency" 2>&1 | tee "$OUT/concurrency$concurrency.txt"
done
