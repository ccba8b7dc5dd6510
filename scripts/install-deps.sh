#!/usr/bin/env bash
# Installs what cusnap needs to build and test, idempotently, as root:
# compilers and libraries from Debian's packages, and CRIU >= 4.1 built from
# Debian's trixie source package (bookworm's 3.17 fails on 6.x kernels).
# Fast when everything is present. Exits non-zero with a message that says
# what is wrong when it cannot finish.
set -euo pipefail

CRIU_MIN="4.1"
CRIU_PREFIX="${CUSNAP_CRIU_PREFIX:-/usr/local}"
CRIU_SRC_DIR="${CUSNAP_CRIU_SRC:-/var/cache/cusnap/criu-src}"

say() { printf 'install-deps: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and CRIU); try: sudo $0"

PKGS=(build-essential cmake pkg-config git ca-certificates
      libcli11-dev nlohmann-json3-dev libmsgpack-cxx-dev doctest-dev libseccomp-dev
      python3 clang-14 libclang-rt-14-dev clang-format xxd
      # the e2e test torchrun_gloo runs a real torchrun job (torch for /usr/bin/python3)
      python3-torch
      # CUSNAP_CRIU_NETWORK_LOCK=iptables (e2e.checkpoint_tcp_rollback)
      iptables
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

have_criu() {
  local bin v
  bin=$(command -v criu 2>/dev/null) || return 1
  v=$(criu_version "$bin")
  [ -n "$v" ] && version_ge "$v" "$CRIU_MIN"
}

# Patches applied to CRIU's source (scripts/patches/criu-*.patch): CRIU 4.1.1
# cannot dump any TCP socket on Linux >= 6.16 (getsockopt SO_PASSCRED fails
# with EOPNOTSUPP there; upstream criu issue 2718). A stamp beside the binary
# names the patches it was built with; a CRIU built here without them is
# built again.
PATCH_DIR="$(cd "$(dirname "$0")" && pwd)/patches"
patch_id=$(cat "$PATCH_DIR"/criu-*.patch 2>/dev/null | sha256sum | cut -c1-16)
CRIU_STAMP="$CRIU_PREFIX/share/cusnap/criu-patches"
criu_current() {
  have_criu || return 1
  # A CRIU not installed by this script (e.g. a newer distribution package) is kept.
  [ "$(command -v criu)" != "$CRIU_PREFIX/sbin/criu" ] && return 0
  [ "$(cat "$CRIU_STAMP" 2>/dev/null)" = "$patch_id" ]
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
  install -m 0755 "$build/criu/criu" "$CRIU_PREFIX/sbin/criu"
  mkdir -p "$(dirname "$CRIU_STAMP")" && echo "$patch_id" >"$CRIU_STAMP"
  hash -r
  have_criu || die "installed $CRIU_PREFIX/sbin/criu but 'criu --version' does not report >= $CRIU_MIN"
fi

criu_bin=$(command -v criu)
if ! out=$("$criu_bin" check 2>&1); then
  say "criu check output:"; printf '%s\n' "$out" >&2
  die "'criu check' fails on this kernel: checkpoints cannot work here (needs root and a kernel with checkpoint/restore support)"
fi
say "ok: $(criu_version "$criu_bin") at $criu_bin ($(echo "$out" | tail -n1))"
