#!/usr/bin/env bash
# Prepares .gpu-bundle/ (ignored by git) for a GPU machine that has no CRIU and
# no build dependencies: the CRIU and iptables binaries with the shared
# libraries they need (glibc excepted: the GPU machine's is newer) and the
# release build.
# Then on the GPU machine: PATH=$PWD/.gpu-bundle/bin:$PATH bash scripts/gpu-test.sh
# (bin/criu is a wrapper that finds the bundled libraries itself).
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu-bundle
rm -rf "$out"; mkdir -p "$out/bin" "$out/lib" "$out/libexec"
criu=$(PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin command -v criu) || { echo "gpu-bundle: criu not found; run scripts/install-deps.sh" >&2; exit 1; }
cp "$criu" "$out/libexec/criu"
# A wrapper gives CRIU its libraries without putting them on everyone's path.
cat >"$out/bin/criu" <<'WRAP'
#!/bin/sh
here=$(cd "$(dirname "$0")/.." && pwd)
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/libexec/criu" "$@"
WRAP
chmod +x "$out/bin/criu"
# iptables (CUSNAP_CRIU_NETWORK_LOCK=iptables, which CRIU runs through sh and
# e2e.checkpoint_tcp_rollback tests): the multi-call binary, its libraries and
# its extensions, behind wrappers named as CRIU calls them.
xt=$(PATH=$PATH:/usr/sbin:/sbin command -v xtables-nft-multi) || { echo "gpu-bundle: xtables-nft-multi not found; run scripts/install-deps.sh" >&2; exit 1; }
cp "$xt" "$out/libexec/"
cp -a /usr/lib/x86_64-linux-gnu/xtables "$out/lib/xtables"
for cmd in iptables ip6tables; do
  cat >"$out/bin/$cmd" <<WRAP
#!/bin/sh
here=\$(cd "\$(dirname "\$0")/.." && pwd)
XTABLES_LIBDIR="\$here/lib/xtables" LD_LIBRARY_PATH="\$here/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/libexec/xtables-nft-multi" $cmd "\$@"
WRAP
  chmod +x "$out/bin/$cmd"
done
ldd "$criu" "$xt" | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|ld-linux*) continue;; esac
  cp -L "$lib" "$out/lib/"
done
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-gpu -j"$(nproc)" >/dev/null
mkdir -p "$out/build"
cp -a build-gpu/bin build-gpu/lib build-gpu/fakecuda "$out/build/" 2>/dev/null || true
du -sh "$out"
