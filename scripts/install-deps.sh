#!/usr/bin/env bash
# Installs what cusnap needs to build and test, idempotently, as root:
# compilers and libraries from Debian's packages, and CRIU >= 4.1 built from
# Debian's trixie source package (bookworm's 3.17 fails on 6.x kernels).
# Not installed here (Debian has no package of them): the CUDA 13.0 toolkit
# headers (cuda.h, cudaTypedefs.h, cudaProfiler.h, cudaProfilerTypedefs.h),
# a prerequisite of the machine; this script checks for them first.
# Fast when everything is present. Exits non-zero with a message that says
# what is wrong when it cannot finish.
#
#   CUSNAP_CUDA_INCLUDE=DIR   where the CUDA headers are (default
#                             /usr/local/cuda/include); the build takes the same
#                             directory as cmake -DCUSNAP_CUDA_INCLUDE=DIR
#                             (scripts/demo.sh and scripts/test.sh pass it on)
#   CUSNAP_CRIU_PREFIX=DIR    where a CRIU built here is installed, as
#                             DIR/sbin/criu (default /usr/local; DIR/sbin is
#                             created when missing)
#   CUSNAP_CRIU_SRC=DIR       where CRIU's source is fetched and built
#                             (default /var/cache/cusnap/criu-src)
# cusnap runs the CRIU named by $CUSNAP_CRIU, or else the first criu on PATH
# (then /usr/local/sbin, /usr/sbin, /sbin): with a prefix outside those, set
# CUSNAP_CRIU=DIR/sbin/criu or put DIR/sbin on PATH (this script says so).
set -euo pipefail

CRIU_MIN="4.1"
CRIU_PREFIX="${CUSNAP_CRIU_PREFIX:-/usr/local}"
CRIU_BIN="$CRIU_PREFIX/sbin/criu"
CUDA_INCLUDE="${CUSNAP_CUDA_INCLUDE:-/usr/local/cuda/include}"
CRIU_SRC_DIR="${CUSNAP_CRIU_SRC:-/var/cache/cusnap/criu-src}"

say() { printf 'install-deps: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

# The CUDA toolkit headers: not a Debian package, so not installed here.
cuda_missing=()
for h in cuda.h cudaTypedefs.h cudaProfiler.h cudaProfilerTypedefs.h; do
  [ -f "$CUDA_INCLUDE/$h" ] || cuda_missing+=("$h")
done
if [ ${#cuda_missing[@]} -gt 0 ]; then
  die "the CUDA 13.0 toolkit headers are missing: ${cuda_missing[*]} not found in $CUDA_INCLUDE.
  They are a prerequisite of the machine (Debian has no package of them): install NVIDIA's
  CUDA 13.0 toolkit headers so that $CUDA_INCLUDE/cuda.h exists (/usr/local/cuda is where
  NVIDIA's packages put them), or, with them elsewhere, set CUSNAP_CUDA_INCLUDE=DIR (this
  script, scripts/demo.sh and scripts/test.sh take it; a build by hand: cmake -DCUSNAP_CUDA_INCLUDE=DIR)"
fi
cuda_version=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$CUDA_INCLUDE/cuda.h" | head -n1)
if [ -z "$cuda_version" ] || [ "$cuda_version" -lt 13000 ]; then
  die "$CUDA_INCLUDE/cuda.h is not of CUDA >= 13.0 (CUDA_VERSION ${cuda_version:-not defined}): install the CUDA 13.0 toolkit headers there, or point CUSNAP_CUDA_INCLUDE (cmake -DCUSNAP_CUDA_INCLUDE=DIR) at them"
fi

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and CRIU); try: sudo bash $0"

PKGS=(build-essential cmake pkg-config git ca-certificates
      libcli11-dev nlohmann-json3-dev libmsgpack-cxx-dev doctest-dev libseccomp-dev
      python3 clang-14 libclang-rt-14-dev clang-format xxd
      # the e2e test torchrun_gloo runs a real torchrun job (torch for /usr/bin/python3)
      python3-torch
      # CUSNAP_CRIU_NETWORK_LOCK=iptables (e2e.checkpoint_tcp_rollback)
      iptables
      # man/check-man-pages.sh reads the pages as groff renders them
      groff-base
      # CRIU build dependencies
      libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
      python3-protobuf libnl-3-dev libnet1-dev libcap-dev libbsd-dev
      libgnutls28-dev libnftables-dev uuid-dev libaio-dev iproute2 dpkg-dev xz-utils patch)

missing=()
for p in "${PKGS[@]}"; do
  [[ "$p" == \#* ]] && continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed: check the machine's Debian sources"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install failed for: ${missing[*]}"
fi

version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

criu_version() {
  local bin="$1"
  "$bin" --version 2>/dev/null | sed -n 's/^Version: *//p' | head -n1
}

# criu_ok BIN: BIN is an executable CRIU >= CRIU_MIN.
criu_ok() {
  local v
  [ -x "$1" ] || return 1
  v=$(criu_version "$1")
  [ -n "$v" ] && version_ge "$v" "$CRIU_MIN"
}

# The CRIU that cusnap will run: $CUSNAP_CRIU, or else the first criu on PATH
# and then in the sbin directories (as src/coord/criu.cpp looks for it).
cusnap_criu() {
  if [ -n "${CUSNAP_CRIU:-}" ]; then echo "$CUSNAP_CRIU"; return 0; fi
  PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin" command -v criu 2>/dev/null
}

# Patches applied to CRIU's source (scripts/patches/criu-*.patch): CRIU 4.1.1
# cannot dump any TCP socket on Linux >= 6.16 (getsockopt SO_PASSCRED fails
# with EOPNOTSUPP there; upstream criu issue 2718). A stamp beside the binary
# names the patches it was built with; a CRIU built here without them is
# built again.
PATCH_DIR="$(cd "$(dirname "$0")" && pwd)/patches"
patch_id=$(cat "$PATCH_DIR"/criu-*.patch 2>/dev/null | sha256sum | cut -c1-16)
CRIU_STAMP="$CRIU_PREFIX/share/cusnap/criu-patches"
# ours_current: the CRIU this script installs at the prefix is there, built
# with the current patches.
ours_current() { criu_ok "$CRIU_BIN" && [ "$(cat "$CRIU_STAMP" 2>/dev/null)" = "$patch_id" ]; }
criu_current() {
  local bin
  ours_current && return 0
  bin=$(cusnap_criu) || return 1
  # A CRIU not installed by this script (e.g. a newer distribution package) is kept.
  [ "$bin" != "$CRIU_BIN" ] && criu_ok "$bin"
}

if ! criu_current; then
  say "CRIU >= $CRIU_MIN built with cusnap's patches not found; building it from Debian trixie's source package"
  mkdir -p "$CRIU_SRC_DIR"
  # A private apt configuration that knows only trixie's source index, on the
  # same mirror as the machine's own bookworm sources.
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
           | grep -v '^ *#' | grep -oE 'https?://[^ ]+/debian/?( |$)' | head -n1 | tr -d ' ' || true)
  [ -n "$mirror" ] || die "cannot find a Debian mirror in /etc/apt/sources.list*; set one up, or install CRIU >= $CRIU_MIN by hand"
  aptdir="$CRIU_SRC_DIR/apt"
  mkdir -p "$aptdir/lists/partial" "$aptdir/sourceparts"
  echo "deb-src $mirror trixie main" > "$aptdir/sources.list"
  o=(-o "Dir::Etc::SourceList=$aptdir/sources.list" -o "Dir::Etc::SourceParts=$aptdir/sourceparts"
     -o "Dir::State::Lists=$aptdir/lists" -o "APT::Get::Only-Source=true")
  apt-get "${o[@]}" update -qq || die "cannot read trixie's source index from $mirror"
  # The .orig tarball is all that is needed; the Debian parts may be missing
  # from the mirror, so apt-get's own verdict is not the test.
  (cd "$CRIU_SRC_DIR" && apt-get "${o[@]}" source --download-only -qq criu >"$CRIU_SRC_DIR/fetch.log" 2>&1) || true
  tarball=$(ls -1 "$CRIU_SRC_DIR"/criu_*.orig.tar.* 2>/dev/null | sort -V | tail -n1)
  [ -n "$tarball" ] || { cat "$CRIU_SRC_DIR/fetch.log" >&2; die "no criu .orig tarball arrived in $CRIU_SRC_DIR"; }
  build="$CRIU_SRC_DIR/build"
  rm -rf "$build"; mkdir -p "$build"
  tar -xf "$tarball" -C "$build" --strip-components=1
  for p in "$PATCH_DIR"/criu-*.patch; do
    [ -e "$p" ] || continue
    patch -d "$build" -p1 --forward -s <"$p" || die "cannot apply $(basename "$p") to $(basename "$tarball")"
  done
  say "compiling CRIU from $(basename "$tarball")"
  make -C "$build" -j"$(nproc)" criu >"$CRIU_SRC_DIR/build.log" 2>&1 \
    || { tail -n 30 "$CRIU_SRC_DIR/build.log" >&2; die "CRIU build failed (log: $CRIU_SRC_DIR/build.log)"; }
  install -D -m 0755 "$build/criu/criu" "$CRIU_BIN" || die "cannot install CRIU as $CRIU_BIN"
  mkdir -p "$(dirname "$CRIU_STAMP")" && echo "$patch_id" >"$CRIU_STAMP"
  hash -r
  criu_ok "$CRIU_BIN" || die "installed $CRIU_BIN but '$CRIU_BIN --version' does not report >= $CRIU_MIN"
fi

# The CRIU that cusnap will run must be >= CRIU_MIN.
criu_bin=$(cusnap_criu || true)
if [ -z "$criu_bin" ] || ! criu_ok "$criu_bin"; then
  where="cusnap would run ${criu_bin:-no CRIU} (\$CUSNAP_CRIU, else the first criu on PATH, /usr/local/sbin, /usr/sbin, /sbin)"
  if criu_ok "$CRIU_BIN"; then
    die "CRIU is installed as $CRIU_BIN, but $where: set CUSNAP_CRIU=$CRIU_BIN or put $CRIU_PREFIX/sbin first on PATH"
  fi
  die "$where, which is not CRIU >= $CRIU_MIN"
fi
if [ "$criu_bin" != "$CRIU_BIN" ] && ours_current; then
  say "note: cusnap will run $criu_bin, not $CRIU_BIN built here (set CUSNAP_CRIU=$CRIU_BIN to use it)"
fi
if ! out=$("$criu_bin" check 2>&1); then
  say "criu check output:"; printf '%s\n' "$out" >&2
  die "'criu check' fails on this kernel: checkpoints cannot work here (needs root and a kernel with checkpoint/restore support)"
fi
say "ok: $(criu_version "$criu_bin") at $criu_bin ($(echo "$out" | tail -n1))"
