#!/usr/bin/env bash
# Bootstraps a box rented with a marketplace's stock PyTorch image instead of the worker image: installs the pinned
# training package, proves the install with the import probe, then hands the box to the agent.
#
# Remote exit codes lie (docs/field-notes.md: a `| tail` ate pip's failure and three boxes died later with "No module
# named peft"), so nothing here is piped, every failure stops the script with a non-zero status and a line saying what
# failed, and the install counts only if the probe printed its sentinel line.
#
# Usage: onstart.sh [command ...]        runs the command when the install is proven (default: the agent)
# Environment:
#   TRAINING_PACKAGE    required: what to install, as pip takes it: a wheel path or URL, a directory, or a
#                       requirement such as "moe-fleet @ https://example.com/moe_fleet-0.1.0-py3-none-any.whl"
#   TRAINING_PINS       the exact versions to hold (default below, the worker image's: config/worker_image.py).
#                       Pick a stock image whose torch matches, e.g. pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime,
#                       so torch is not downloaded again and the image's CUDA tag is what the ranking asks for.
#   TRAINING_PIP_ARGS   extra pip arguments, word-split (e.g. "--no-deps", "--index-url ...")
#   PYTHON              the interpreter to install into (default: python3, else python)
#   TRAINING_PROBE_EXTRA  more modules the probe must import (see training/probe.py)
set -euo pipefail

SENTINEL=TRAINING_PROBE_OK
pins="${TRAINING_PINS-torch==2.11.0 triton==3.6.0 transformers==5.17.0 peft==0.21.0}"

fail() {
  echo "onstart: FAILED: $*" >&2
  exit 1
}

package="${TRAINING_PACKAGE:-}"
[ -n "$package" ] || fail "TRAINING_PACKAGE is not set (a wheel, URL, directory or pip requirement)"
python="${PYTHON:-}"
if [ -z "$python" ]; then
  python="$(command -v python3 || command -v python || true)"
fi
[ -n "$python" ] && command -v "$python" > /dev/null || fail "no Python interpreter found (set PYTHON)"

read -r -a pin_args <<< "$pins"
read -r -a pip_args <<< "${TRAINING_PIP_ARGS:-}"
echo "onstart: installing ${package} with ${pins:-no pins} into $("$python" -c 'import sys; print(sys.prefix)')"
if ! PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
    "$python" -m pip install "${pip_args[@]}" "$package" "${pin_args[@]}"; then
  fail "pip could not install ${package} with ${pins:-no pins}"
fi

log="$(mktemp)"
status=0
"$python" -m training.probe > "$log" 2>&1 || status=$?
cat "$log"
found=0
grep -qx "$SENTINEL" "$log" && found=1
rm -f "$log"
[ "$status" -eq 0 ] || fail "the install probe exited ${status}"
[ "$found" -eq 1 ] || fail "the install probe printed no sentinel line"

if [ "$#" -eq 0 ]; then
  set -- "$python" -m training.agent
fi
echo "onstart: install proven; exec $*"
exec "$@"
