#!/usr/bin/env bash
# make demo: convert the built-in stories260K model to GGUF (first run only)
# and tell a story with the reference engine.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
model=models/stories260K.gguf
if [ ! -s "$model" ]; then
    "$BUILD"/bin/convert-llama2c -i models/stories260K.bin -k models/tok512.bin -o "$model" --name stories260K
fi
exec "$BUILD"/bin/pi2-ref -m "$model" -p "${PI2_DEMO_PROMPT:-Once upon a time}" -n 200 -t 2 --temp 0.8 --seed "${PI2_DEMO_SEED:-42}"
