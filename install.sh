#!/usr/bin/env bash
# Installs adloader and what it needs on a fresh machine. Idempotent.
#   ./install.sh          the product (torch CPU build 2.13.0 if no torch is present)
#   ./install.sh --test   the product plus the test tools, Debian's prometheus and a one-node Slurm
#                         (slurmctld, slurmd, munge, client tools: tests/test_slurm.py starts them itself)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
want_tests=0
[ "${1:-}" = "--test" ] && want_tests=1

# Keep a torch the user already has (their CUDA build); otherwise take the CPU build.
# Never let pip resolve an unpinned torch: that pulls gigabytes of CUDA packages.
if ! "$PY" -c 'import torch' 2>/dev/null; then
  echo "install.sh: installing torch==2.13.0 (CPU build)"
  "$PY" -m pip install -q torch==2.13.0
fi
extras="[plot]"  # the main job (adloader demo) ends with a plot
[ $want_tests = 1 ] && extras="[test]"
"$PY" -m pip install -q -e ".${extras}"
command -v pyenv >/dev/null 2>&1 && pyenv rehash || true

if [ $want_tests = 1 ] && ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "install.sh: installing Debian's prometheus (server and promtool) for the tests"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    # The package starts a system Prometheus on :9090; the tests run their own.
    (systemctl stop prometheus 2>/dev/null || service prometheus stop 2>/dev/null || pkill -x prometheus) >/dev/null 2>&1 || true
  else
    echo "install.sh: promtool missing and cannot apt-get it here; the Prometheus tests will be skipped" >&2
  fi
fi
if [ $want_tests = 1 ] && ! command -v slurmd >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "install.sh: installing Debian's Slurm (slurmctld, slurmd, munge, client tools) for tests/test_slurm.py"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
    # On a systemd host the packages may start daemons with the stock configuration; the test runs its own.
    (systemctl stop slurmctld slurmd 2>/dev/null || true) >/dev/null 2>&1
  else
    echo "install.sh: Slurm missing and cannot apt-get it here; tests/test_slurm.py will be skipped" >&2
  fi
fi
echo "install.sh: done ($("$PY" -c 'import adloader; print("adloader", adloader.__version__)'))"
