#!/usr/bin/env bash
# Set up and run the whole test suite on a fresh machine (Python >= 3.11 with pip, and apt):
#   1. Prometheus from Debian (the integration tests start a real one; promtool checks PromQL)
#   2. phaseprobe with its test extras, editable
#   3. the local CPU vLLM and tiny model (~2.5 min and ~2.5 GB the first time, then cached)
#   4. pytest: unit tests and the integration tests against the real vLLM
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus
fi
python3 -m pip install -q -e '.[test]'
python3 -m phaseprobe local install
exec python3 -m pytest -m "integration or not integration" "$@"
