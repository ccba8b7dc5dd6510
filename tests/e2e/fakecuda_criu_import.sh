#!/usr/bin/env bash
# Two processes share a POSIX-fd allocation through the simulated driver.
# 1. The importer holding its import: driver checkpoint succeeds, restore fails
#    CUDA_ERROR_NOT_SUPPORTED (801) and unlock CUDA_ERROR_ILLEGAL_STATE (401),
#    as measured on the real driver.
# 2. An importer that released its import (address reservation kept) goes
#    through driver checkpoint, a real CRIU dump and restore, driver restore
#    and unlock; it then re-imports a fresh export at the same address,
#    reads the creator's bytes and writes one the creator sees.
. "$(dirname "$0")/lib_fakecuda.sh"

start exporter "$B/fakecuda_share" export 8
wait_for exporter '^export ' 10
read -r _ EPID EFD < <(grep -m1 '^export ' "$T/exporter.out")
KILL_PIDS+=("$EPID")

# 1. Unreleased import: stuck CHECKPOINTED.
start stuck "$B/fakecuda_share" import "$EPID" "$EFD" 8
wait_for stuck '^imported' 10
SPID=$(eval echo "\$CHILD_stuck")
"$B/fakecuda_ckpt" suspend "$SPID" 5000 || fail "checkpoint of the holding importer"
out=$("$B/fakecuda_ckpt" restore "$SPID" || true)
grep -q '(801)' <<<"$out" || fail "restore of the holding importer: want 801, got: $out"
[ "$("$B/fakecuda_ckpt" state "$SPID" | head -1)" = "state 2" ] || fail "holding importer not left CHECKPOINTED"
out=$("$B/fakecuda_ckpt" unlock "$SPID" || true)
grep -q '(401)' <<<"$out" || fail "unlock of the stuck importer: want 401, got: $out"
kill_reap "$SPID"

# 2. Released import, through CRIU.
start importer "$B/fakecuda_share" import "$EPID" "$EFD" 8
wait_for importer '^imported' 10
IPID=$(eval echo "\$CHILD_importer")
kill -USR1 "$IPID"
wait_for importer '^released' 10
if grep "memfd:fakecuda:$EPID:" "/proc/$IPID/maps" >/dev/null; then fail "importer still maps the export"; fi
"$B/fakecuda_ckpt" suspend "$IPID" 5000 || fail "checkpoint of the released importer"
"$B/fakecuda_ckpt" suspend "$EPID" 5000 || fail "checkpoint of the exporter"
dump importer "$IPID"
restore importer
"$B/fakecuda_ckpt" resume "$EPID" || fail "restore of the exporter"
"$B/fakecuda_ckpt" resume "$IPID" || fail "restore of the released importer"
# The creator exports afresh (its old descriptor names released memory).
kill -USR1 "$EPID"
for _ in $(seq 1 100); do [ "$(count exporter '^export ')" -ge 2 ] && break; sleep 0.1; done
[ "$(count exporter '^export ')" -ge 2 ] || fail "no fresh export"
grep '^export ' "$T/exporter.out" | tail -1 | cut -d' ' -f2- >"$T/reimport"
kill -USR2 "$IPID"
wait_for importer '^reimported ok' 10
grep -q "memfd:fakecuda:$EPID:" "/proc/$IPID/maps" || fail "re-import not mapped from the exporter"
wait_for exporter '^tick [0-9]* 66$' 10  # 0x42 written by the importer
if grep -q CORRUPT "$T/importer.out" "$T/exporter.out"; then fail "bytes corrupted"; fi
echo "PASS"
