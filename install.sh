#!/usr/bin/env bash
# Installs adloader and what it needs on a fresh machine. Idempotent.
#   ./install.sh               the product, into the current Python (torch CPU build 2.13.0 if no torch is present)
#   ./install.sh --test        the product plus the test tools and, as root with apt, Debian's prometheus and
#                              Slurm (slurmctld, slurmd, munge, client tools). Their daemons are not started
#                              (a policy-rc.d refuses it during the install): the tests start their own.
#   sudo ./install.sh --system a server install: a venv in /opt/adloader (it sees the system's packages, so a
#                              CUDA torch already there is kept; run from a venv whose torch the system lacks,
#                              it is given that torch through a .pth file instead of a download),
#                              /usr/local/bin/adloader for every user, the systemd unit and /etc/default/adloader;
#                              enables and (re)starts the service.
#                              Run it again after `git pull` to upgrade: running jobs are adopted.
#   sudo ./install.sh --uninstall [--purge]
#                              stops the service, lifts every limit and removes every job group (the jobs keep
#                              running), removes the venv, the command and the unit; --purge also removes
#                              /etc/default/adloader and /var/lib/adloader (state and job history).
# Paths of the server install (for tests, or another layout): ADLOADER_PREFIX (/opt/adloader),
# ADLOADER_BIN_DIR (/usr/local/bin), ADLOADER_UNIT_DIR (/etc/systemd/system), ADLOADER_CONFIG (/etc/default/adloader);
# of --test: ADLOADER_POLICY_RC (/usr/sbin/policy-rc.d).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
PREFIX=${ADLOADER_PREFIX:-/opt/adloader}
BIN_DIR=${ADLOADER_BIN_DIR:-/usr/local/bin}
UNIT_DIR=${ADLOADER_UNIT_DIR:-/etc/systemd/system}
CONFIG=${ADLOADER_CONFIG:-/etc/default/adloader}
POLICY_RC=${ADLOADER_POLICY_RC:-/usr/sbin/policy-rc.d}
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

# The server venv sees the system's packages, not those of a venv that $PY may belong to (venv builds
# on the base interpreter). When only $PY's environment has torch (a user's venv, its CUDA build), a .pth
# file puts that environment's site-packages after the server venv's own: its torch (and any other package
# there) is used, not downloaded again. The server then needs that environment: the message says so.
share_torch_of_installer() {
  local venv_python=$1 torch_site server_site
  "$venv_python" -c 'import torch' 2>/dev/null && return 0
  torch_site=$("$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null) \
    || return 0
  server_site=$("$venv_python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  echo "$torch_site" > "$server_site/adloader-installer-torch.pth"
  echo "install.sh: the server venv uses the packages in $torch_site, torch among them (the environment of" \
       "$PY): keep that environment, or install torch for the system's Python and run install.sh --system again"
}

system_install() {
  need_root
  # No pip of its own: the system's pip and setuptools serve it (an older bundled setuptools would
  # shadow them); ensurepip only where the system has no pip.
  [ -x "$PREFIX/bin/python" ] || "$PY" -m venv --system-site-packages --without-pip "$PREFIX"
  "$PREFIX/bin/python" -m pip --version >/dev/null 2>&1 || "$PREFIX/bin/python" -m ensurepip -q
  share_torch_of_installer "$PREFIX/bin/python"
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

# apt-get install without starting the packages' daemons (Prometheus on :9090, slurmctld, munged): the
# tests start their own. A policy-rc.d that refuses every start, for the length of the install, is how
# Debian lets an installer say so; nothing is started, so nothing needs stopping. A policy-rc.d the
# machine already has is left to decide; then only the service manager stops what started.
# $1: the packages' services (space-separated), $2...: the packages.
apt_install_without_starting() {
  local services=$1 policy=$POLICY_RC made=0 status=0
  shift
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# install.sh: no daemon starts while it installs packages\nexit 101\n' > "$policy"
    chmod 0755 "$policy"
    made=1
    trap 'rm -f "$POLICY_RC"' EXIT
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null || status=$?
  if [ $made = 1 ]; then
    rm -f "$policy"
    trap - EXIT
  else
    local unit
    for unit in $services; do
      (systemctl stop "$unit" 2>/dev/null || service "$unit" stop 2>/dev/null) >/dev/null 2>&1 || true
    done
  fi
  return $status
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
  "$PY" -m pip install -q -c "$pin" -e ".[lightning,accelerate,transformers]" torchdata
  rm -f "$pin"
fi
command -v pyenv >/dev/null 2>&1 && pyenv rehash || true

if [ $want_tests = 1 ] && ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "install.sh: installing Debian's prometheus (server and promtool) for the tests; its service is not started"
    apt_install_without_starting "prometheus" prometheus
  else
    echo "install.sh: promtool missing and cannot apt-get it here; the Prometheus tests will be skipped" >&2
  fi
fi
if [ $want_tests = 1 ] && ! command -v slurmd >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "install.sh: installing Debian's Slurm (slurmctld, slurmd, munge, client tools) for tests/test_slurm.py;" \
         "its services are not started"
    apt_install_without_starting "slurmctld slurmd munge" slurmctld slurmd slurm-client munge
  else
    echo "install.sh: Slurm missing and cannot apt-get it here; tests/test_slurm.py will be skipped" >&2
  fi
fi
echo "install.sh: done ($("$PY" -c 'import adloader; print("adloader", adloader.__version__)'))"
