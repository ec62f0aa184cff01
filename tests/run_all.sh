#!/usr/bin/env bash
# Set up and run the whole test suite on a fresh machine (Python >= 3.11 with pip, and apt):
#   1. Prometheus from Debian (the integration tests start a real one; promtool checks PromQL)
#      and its Alertmanager (the alert tests deliver one alert through it to a webhook)
#      and Chromium with an emoji font (the dashboard's end-to-end test drives it headless
#      through Playwright; no browser is downloaded)
#   2. phaseprobe with its test extras (playwright among them), editable
#   3. the local CPU vLLM and tiny model (~2.5 min and ~2.5 GB the first time, then cached),
#      and the real vllm-router in a venv of its own (~20 s and ~130 MB the first time) for
#      the fleet tests
#   4. pytest, twice: the tests not marked integration on two processes (pytest-xdist), then
#      the integration tests against the real vLLM in one process (their servers are started
#      once per session); the dashboard's screenshots go to $PHASEPROBE_ARTIFACTS_DIR (default:
#      artifacts/ at the repo root)
set -euo pipefail
cd "$(dirname "$0")/.."
apt_packages=()
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  apt_packages+=(prometheus)
fi
[ -x /usr/bin/prometheus-alertmanager ] || apt_packages+=(prometheus-alertmanager)
[ -x /usr/bin/chromium ] || apt_packages+=(chromium)
# without it the dashboard's status emoji are empty boxes in the screenshots
[ -e /usr/share/fonts/truetype/noto/NotoColorEmoji.ttf ] || apt_packages+=(fonts-noto-color-emoji)
if [ "${#apt_packages[@]}" -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${apt_packages[@]}"
fi
python3 -m pip install -q -e '.[test]'
python3 -m phaseprobe local install
python3 -m phaseprobe.local.router install
# The types and the layering are checked like tests: mypy over the package, and
# import-linter's contract in pyproject.toml (no room imports from a room above it).
python3 -m mypy phaseprobe
lint-imports
# the house rules (pyproject.toml [tool.ruff]): pyflakes, pycodestyle, import order, bugbear,
# and one layout (ruff format) so diffs show changes, not styles
ruff check phaseprobe tests bench
ruff format --check phaseprobe tests bench
# A missing browser fails the dashboard's browser test here instead of skipping it.
export PHASEPROBE_REQUIRE_BROWSER=1
# Arguments go to both runs. Either run failing fails the script with its exit code, and so
# does exit 5 ("no tests collected"), except when arguments were given and the other run
# collected tests (`bash tests/run_all.sh tests/unit/test_store.py` has no integration test).
set +e
python3 -m pytest -n 2 -m "not integration" "$@"
unit=$?
if [ "$unit" -ne 0 ] && [ "$unit" -ne 5 ]; then exit "$unit"; fi
# The integration tests in one process: their servers are started once per session. (The
# modules tests/integration/conftest.py marks own_servers could run in a second process beside
# the others: that halved the wall time in a trial, but beside a busy core too, 7 timing tests
# failed at load 40, so the split waits until they hold there.)
python3 -m pytest -m integration "$@"
integration=$?
if [ "$integration" -ne 0 ] && [ "$integration" -ne 5 ]; then exit "$integration"; fi
# each run passed (0) or collected nothing (5) here
if [ "$unit" -eq 0 ] && [ "$integration" -eq 0 ]; then exit 0; fi
if [ "$#" -gt 0 ] && [ "$unit" -ne "$integration" ]; then exit 0; fi
exit 5
