#!/usr/bin/env bash
# Install everything jupyter-hpcai needs on a fresh Debian 12 machine, as root. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  slurm-wlm munge                       # the dev cluster
  slurmdbd mariadb-server               # its accounting (slurmdbd on a MariaDB server of its own)
  iproute2                              # its nodes as separate network hosts (ip netns, bridge, veth)
  openmpi-bin libopenmpi-dev            # MPI for the engines and Horovod
  cmake g++ python3-dev python3-venv    # Horovod and mpi4py build from source
  sudo                                  # the hub spawns servers as other users
  lmod                                  # `module load` in recipes (tests use a real modulefile)
  chromium                              # browser tests (Playwright drives Debian's Chromium)
  proot debootstrap                     # container envs: udocker's P1 mode, and the tests' Debian image
)
took() { echo "[setup: $1: $((SECONDS - $2)) s]"; }  # each phase says how long it took
start=$SECONDS
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
command -v npm >/dev/null || missing+=(nodejs npm)  # configurable-http-proxy; the image may ship its own Node
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi

took "Debian packages" "$start"

# The proxy (npm) installs beside the project's virtualenv (pip): neither needs the other.
start=$SECONDS
proxy=""
npm_log=$(mktemp)  # a fresh file of root's: never a name in /tmp that another user could have made first
trap 'rm -f "$npm_log"' EXIT
if ! command -v configurable-http-proxy >/dev/null; then
  npm install -g --no-fund --no-audit configurable-http-proxy > "$npm_log" 2>&1 &
  proxy=$!
fi
# The project's virtualenv, from the system python so that other unix users can run it.
[[ -x .venv/bin/python ]] || /usr/bin/python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[hub,test]'
if [[ -n $proxy ]] && ! wait "$proxy"; then
  cat "$npm_log"
  echo "setup: npm could not install configurable-http-proxy (its output is above)" >&2
  exit 1
fi
took "the project's virtualenv and the proxy" "$start"

# Notebook servers and jobs run as other unix users and must run .venv: let every user traverse
# (not list) the directories above the checkout, which may sit under /root (mode 700).
dir=$(pwd)
while [[ $dir != / ]]; do chmod o+x "$dir"; dir=$(dirname "$dir"); done
