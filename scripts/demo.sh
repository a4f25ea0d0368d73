#!/usr/bin/env bash
# make demo: convert the built-in stories260K model to GGUF (first run only),
# bring up the pi2 stack on it, tell a story through it, and take it down.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
model=models/stories260K.gguf
if [ ! -s "$model" ]; then
    "$BUILD"/bin/convert-llama2c -i models/stories260K.bin -k models/tok512.bin -o "$model" --name stories260K
fi
pi2="$BUILD/bin/pi2"
run="demo-$$"
trap '"$pi2" down -r "$run" >/dev/null 2>&1 || true' EXIT
"$pi2" up -m "$model" -r "$run" -c configs/default.conf
"$pi2" run -r "$run" -p "${PI2_DEMO_PROMPT:-Once upon a time}" -n 200 --temp 0.8 --seed "${PI2_DEMO_SEED:-42}"
