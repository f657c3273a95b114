#!/usr/bin/env bash
# Build Slurm 24.11 for this Debian 12 machine into a prefix of its own, as root.
# Usage: scripts/build-slurm.sh [PREFIX]   (default /var/cache/hpcai/slurm-24.11)
# The source is Debian 13 (trixie)'s slurm-wlm upstream tarball, fetched through apt with a private
# apt configuration: the system's apt sources are never changed and no trixie binary is installed.
# Safe to re-run: a finished build (PREFIX/.built) is reused at once.
set -euo pipefail

PREFIX=${1:-/var/cache/hpcai/slurm-24.11}
PREFIX=${PREFIX%/}
SUITE=${SLURM_SRC_SUITE:-trixie}                    # where the 24.11 source package comes from
WORK="$(dirname "$PREFIX")/$(basename "$PREFIX")-build"  # apt lists, source, build log
LOG="$WORK/build.log"

# The cache: a finished build answers in well under a second. (24.11's client commands, even
# `sinfo --version`, need a slurm.conf first; the daemons' -V does not.)
if [[ -f "$PREFIX/.built" ]] && version=$("$PREFIX/sbin/slurmctld" -V 2>/dev/null); then
  echo "build-slurm: $version already built in $PREFIX"
  exit 0
fi

start=$SECONDS
[[ $(id -u) == 0 ]] || { echo "build-slurm: run as root (apt-get, make install)" >&2; exit 1; }
mkdir -p "$WORK"
exec 9>"$WORK/lock"
flock -n 9 || { echo "build-slurm: another build is running ($WORK/lock)" >&2; exit 1; }

# Build dependencies, from bookworm; only what is missing.
APT_PACKAGES=(
  build-essential pkg-config          # compiler, make, configure's library checks
  munge libmunge-dev                  # auth/munge, cred/munge
  libpmix-dev                         # mpi/pmix (PMIx 4.2 in /usr/lib/x86_64-linux-gnu/pmix2)
  libmariadb-dev                      # slurmdbd's accounting_storage/mysql (mariadb_config)
  libhwloc-dev libnuma-dev            # node topology
  libdbus-1-dev                       # cgroup/v2 (talks to systemd over dbus)
  libjson-c-dev libyaml-dev           # serializer/json and yaml (--json / --yaml output)
  libreadline-dev zlib1g-dev          # interactive scontrol, sbcast compression
)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "build-slurm: installing ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi

# A private apt setup that only knows trixie's source index, on the mirror the machine already uses.
mirror=$( { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | cut -d: -f2-
            grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
              | sed 's/\[[^]]*\]//' | awk '{print $2}'; } \
          | tr ' ' '\n' | grep -E '^https?://.*/debian/?$' | head -n1 || true)
mirror=${mirror:-http://deb.debian.org/debian}
mirror=${mirror%/}
APT_DIR="$WORK/apt"
rm -rf "$APT_DIR" "$WORK/src"
mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/sources.list.d" "$WORK/src"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $SUITE main" \
  > "$APT_DIR/sources.list"
APT_OPTS=(
  -o Dir::Etc::sourcelist="$APT_DIR/sources.list"
  -o Dir::Etc::sourceparts="$APT_DIR/sources.list.d"
  -o Dir::State::Lists="$APT_DIR/lists"
  -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=   # leave the system's apt caches alone
  -o APT::Sandbox::User=root                             # download into a root-owned dir
)
echo "build-slurm: fetching slurm-wlm's upstream source from $mirror $SUITE (log: $LOG)"
: > "$LOG"
apt-get "${APT_OPTS[@]}" update >> "$LOG" 2>&1
# --tar-only: just the upstream tarball (checked against the signed index); Debian's patches are not used.
(cd "$WORK/src" && apt-get "${APT_OPTS[@]}" source --download-only --tar-only slurm-wlm >> "$LOG" 2>&1)
tarball=$(find "$WORK/src" -maxdepth 1 -name 'slurm-wlm_24.11.*.orig.tar.*' ! -name '*.asc' | head -n1)
[[ -n $tarball ]] || { echo "build-slurm: no slurm-wlm 24.11 tarball in $SUITE:" >&2; ls "$WORK/src" >&2; exit 1; }
echo "build-slurm: building $(basename "$tarball") into $PREFIX"
mkdir -p "$WORK/src/slurm"
tar -xf "$tarball" -C "$WORK/src/slurm" --strip-components=1

fail() { echo "build-slurm: $1 failed; the end of $LOG:" >&2; tail -n 40 "$LOG" >&2; exit 1; }
pmix=$(pkg-config --variable=prefix pmix)   # /usr/lib/x86_64-linux-gnu/pmix2 on bookworm
cd "$WORK/src/slurm"
# --enable-multiple-slurmd: the dev cluster runs several slurmd (-N n1, -N n2...) on one host; without
# it 24.11 refuses two nodes with the same NodeHostname and shares one cgroup (/slurm) between them.
./configure --prefix="$PREFIX" --sysconfdir="$PREFIX/etc" \
  --with-pmix="$pmix" --with-munge=/usr --with-mysql_config=/usr/bin \
  --with-hwloc=/usr --with-json=/usr --with-yaml=/usr \
  --enable-cgroupv2 --enable-multiple-slurmd --disable-debug >> "$LOG" 2>&1 || fail configure
make -j"$(nproc)" >> "$LOG" 2>&1 || fail make
make install >> "$LOG" 2>&1 || fail "make install"
# Each plugin this project relies on must be there, or the build is not usable.
for plugin in mpi_pmix auth_munge accounting_storage_mysql cgroup_v2 select_cons_tres; do
  [[ -e "$PREFIX/lib/slurm/$plugin.so" ]] || fail "plugin check ($plugin.so missing)"
done
version=$("$PREFIX/sbin/slurmctld" -V) || fail "slurmctld -V"
touch "$PREFIX/.built"
echo "build-slurm: $version in $PREFIX, took $((SECONDS - start)) s"
