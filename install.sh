#!/usr/bin/env bash
# Installs adloader and what it needs on a fresh machine. Idempotent.
#   ./install.sh               the product, into the current Python (torch CPU build 2.13.0 if no torch is present)
#   ./install.sh --test        the product plus the test tools, Debian's prometheus and a one-node Slurm
#                              (slurmctld, slurmd, munge, client tools: tests/test_slurm.py starts them itself)
#   sudo ./install.sh --system a server install: a venv in /opt/adloader (it sees the system's packages, so a
#                              CUDA torch already there is kept), /usr/local/bin/adloader for every user, the
#                              systemd unit and /etc/default/adloader; enables and (re)starts the service.
#                              Run it again after `git pull` to upgrade: running jobs are adopted.
#   sudo ./install.sh --uninstall [--purge]
#                              stops the service, lifts every limit and removes every job group (the jobs keep
#                              running), removes the venv, the command and the unit; --purge also removes
#                              /etc/default/adloader and /var/lib/adloader (state and job history).
# Paths of the server install (for tests, or another layout): ADLOADER_PREFIX (/opt/adloader),
# ADLOADER_BIN_DIR (/usr/local/bin), ADLOADER_UNIT_DIR (/etc/systemd/system), ADLOADER_CONFIG (/etc/default/adloader).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
PREFIX=${ADLOADER_PREFIX:-/opt/adloader}
BIN_DIR=${ADLOADER_BIN_DIR:-/usr/local/bin}
UNIT_DIR=${ADLOADER_UNIT_DIR:-/etc/systemd/system}
CONFIG=${ADLOADER_CONFIG:-/etc/default/adloader}
UNIT=adloader-controller.service
STATE_DIR=/var/lib/adloader
mode=${1:-}
want_tests=0
[ "$mode" = "--test" ] && want_tests=1

systemd_running() { [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; }
need_root() { [ "$(id -u)" = 0 ] || { echo "install.sh $mode: needs root (sudo ./install.sh $mode)" >&2; exit 1; }; }

# Keep a torch the user already has (their CUDA build); otherwise take the CPU build.
# Never let pip resolve an unpinned torch: that pulls gigabytes of CUDA packages.
ensure_torch() {
  if ! "$1" -c 'import torch' 2>/dev/null; then
    echo "install.sh: installing torch==2.13.0 (CPU build)"
    "$1" -m pip install -q torch==2.13.0
  fi
}

system_install() {
  need_root
  # No pip of its own: the system's pip and setuptools serve it (an older bundled setuptools would
  # shadow them); ensurepip only where the system has no pip.
  [ -x "$PREFIX/bin/python" ] || "$PY" -m venv --system-site-packages --without-pip "$PREFIX"
  "$PREFIX/bin/python" -m pip --version >/dev/null 2>&1 || "$PREFIX/bin/python" -m ensurepip -q
  ensure_torch "$PREFIX/bin/python"
  "$PREFIX/bin/python" -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 71)' \
    2>/dev/null || "$PREFIX/bin/python" -m pip install -q 'setuptools>=71'
  # A regular install, not editable: the clone may move or go. Built with the venv's setuptools.
  "$PREFIX/bin/python" -m pip install -q --upgrade --no-build-isolation ".[plot]"
  mkdir -p "$BIN_DIR" "$UNIT_DIR" "$(dirname "$CONFIG")"
  ln -sfn "$PREFIX/bin/adloader" "$BIN_DIR/adloader"
  sed "s|/opt/adloader/bin/adloader|$PREFIX/bin/adloader|" "deploy/systemd/$UNIT" > "$UNIT_DIR/$UNIT"
  [ -e "$CONFIG" ] || install -m 0644 deploy/systemd/adloader.default "$CONFIG"
  if systemd_running; then
    systemctl daemon-reload
    systemctl enable -q "$UNIT"
    systemctl restart "$UNIT"  # an upgrade: the new controller adopts the running jobs
    echo "install.sh: $UNIT enabled and (re)started; options in $CONFIG; check with: adloader status"
  else
    echo "install.sh: systemd is not running here; start the controller with: $PREFIX/bin/adloader controller"
  fi
  echo "install.sh: done ($("$BIN_DIR/adloader" --version) in $PREFIX, command $BIN_DIR/adloader)"
}

system_uninstall() {
  need_root
  if systemd_running && [ -e "$UNIT_DIR/$UNIT" ]; then
    systemctl disable -q --now "$UNIT" || true  # SIGTERM: the controller lifts every limit
  fi
  if [ -x "$PREFIX/bin/adloader" ]; then
    opts=$( [ -r "$CONFIG" ] && . "$CONFIG"; echo "${ADLOADER_OPTS:-}" )
    # The unit's own paths first, then the operator's options (which name the group, the backend).
    # shellcheck disable=SC2086
    "$PREFIX/bin/adloader" controller --socket /run/adloader/adloader.sock --state-dir "$STATE_DIR" \
      $opts --remove-groups || {
        echo "install.sh --uninstall: nothing removed; stop the controller first (see above)" >&2; exit 1; }
  fi
  rm -f "$UNIT_DIR/$UNIT"
  systemd_running && systemctl daemon-reload
  if [ "$(readlink "$BIN_DIR/adloader" 2>/dev/null)" = "$PREFIX/bin/adloader" ]; then rm -f "$BIN_DIR/adloader"; fi
  rm -rf "$PREFIX"
  if [ "${1:-}" = "--purge" ]; then
    rm -rf "$CONFIG" "$STATE_DIR"
    echo "install.sh: uninstalled; $CONFIG and $STATE_DIR removed"
  else
    echo "install.sh: uninstalled; kept $CONFIG and $STATE_DIR (state, job history): --purge removes them"
  fi
}

case "$mode" in
  --system) system_install; exit 0 ;;
  --uninstall) system_uninstall "${2:-}"; exit 0 ;;
  ""|--test) ;;
  *) echo "usage: ./install.sh [--test | --system | --uninstall [--purge]]" >&2; exit 2 ;;
esac

ensure_torch "$PY"
extras="[plot]"  # the main job (adloader demo) ends with a plot
[ $want_tests = 1 ] && extras="[test]"
"$PY" -m pip install -q -e ".${extras}"
if [ $want_tests = 1 ]; then
  # The framework extras (Lightning, Accelerate) and torchdata for the loader's integration tests, with
  # the installed torch as a constraint: pip must never download or replace torch for them.
  pin=$(mktemp)
  "$PY" -c 'import torch; print("torch==" + torch.__version__.split("+")[0])' > "$pin"
  "$PY" -m pip install -q -c "$pin" -e ".[lightning,accelerate]" torchdata
  rm -f "$pin"
fi
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
