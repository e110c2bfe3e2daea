#!/usr/bin/env bash
# Installs the comparison peers and the profiler into .bench-venv (kept apart from Corral's own venv):
# the Rust `vllm-router` from PyPI and py-spy.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .bench-venv
.bench-venv/bin/python -m pip install --quiet --upgrade pip
.bench-venv/bin/python -m pip install --quiet vllm-router py-spy
echo "installed: $(.bench-venv/bin/pip show vllm-router | grep ^Version), py-spy $(.bench-venv/bin/py-spy --version)"
