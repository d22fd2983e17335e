#!/usr/bin/env bash
# Install everything the test suite needs into .venv and run every test.
# As root on Debian/Ubuntu it also installs the system tools (graphviz, redis-server, Java, the RDMA/netlink
# libraries mooncake_master needs);
# elsewhere, tests that need a missing tool skip with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=""
  command -v dot >/dev/null || need="$need graphviz"
  command -v redis-server >/dev/null || need="$need redis-server"
  command -v java >/dev/null || need="$need default-jre-headless"
  # Mooncake's transfer engine links these even when it only speaks TCP.
  for lib in libibverbs1 libnl-3-200 libnl-route-3-200; do
    dpkg -s "$lib" >/dev/null 2>&1 || need="$need $lib"
  done
  if [ -n "$need" ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends $need >/dev/null
  fi
fi
python3 -m venv .venv
.venv/bin/pip install -q -c constraints/test.txt torch==2.13.0
.venv/bin/pip install -q -c constraints/test.txt -e ".[test]"
# The reference package tests/compat runs side by side with featurestream: without its dependency tree
# (which pins another transformers and CUDA-only packages), plus the few modules its streaming and EAGLE-3
# target modules import.
.venv/bin/pip install -q -c constraints/test.txt --no-deps nemo-automodel
.venv/bin/pip install -q -c constraints/test.txt datasets pillow pyyaml
# vLLM (tests/vllm) in its own environment, .venv-vllm: its pins conflict with the test dependencies above.
bash scripts/vllm-env.sh
.venv/bin/ruff check src tests benchmarks
.venv/bin/ruff format --check src tests benchmarks
# pytest-xdist: FEATURESTREAM_TEST_WORKERS processes (default 4: most tests wait on servers, subprocesses, lease
# timeouts or TLC, so more workers than a 2-core machine's cores pay). --dist loadscope as tests/conftest.py refines
# it: a module's tests share a worker only where they share a module-scoped fixture. -n 0 runs them in this process.
.venv/bin/python -m pytest -n "${FEATURESTREAM_TEST_WORKERS:-4}" --dist loadscope "$@"
