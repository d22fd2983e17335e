#!/usr/bin/env bash
# Install featurestream into .venv (CPU torch) and run the end-to-end demo.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q -c constraints/test.txt torch==2.13.0
.venv/bin/pip install -q -c constraints/test.txt -e .
.venv/bin/featurestream demo "$@"
