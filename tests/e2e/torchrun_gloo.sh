#!/usr/bin/env bash
# A real torchrun job: PyTorch's elastic agent and two worker processes
# (tests/gpu/torch_allreduce.py, gloo backend on CPU tensors), with their
# TCPStore rendezvous and the TCP connections between them, runs under
# `cusnap launch --strict` and goes through three checkpoint/kill/restore
# cycles while the all-reduce loop runs with no sleep between steps. After each
# restore both ranks count on from exactly where they stopped (no new "ready"
# line: nothing started again), every result is right, the agent and both
# ranks are the same processes (CRIU restores pids) and the manifest records
# the established TCP connections. Needs Debian's python3-torch (torch for
# /usr/bin/python3; scripts/install-deps.sh installs it); skipped without it.
source "$(dirname "$0")/lib_shared.sh"

PY=/usr/bin/python3
WORKLOAD=$(cd "$(dirname "$0")/../gpu" && pwd)/torch_allreduce.py
EVERY=50
if ! err=$("$PY" -c 'import torch' 2>&1); then
  skip "$PY cannot import torch (install python3-torch; scripts/install-deps.sh does): $(tail -n1 <<<"$err")"
fi
# torchrun prefixes each worker's lines with "[defaultR]:" (--tee 1).
PREFIXES=('\[default0\]:rank 0 ' '\[default1\]:rank 1 ')

# job_tree PID: PID and all its descendants, one a line, sorted.
job_tree() {
  local p
  echo "$1"
  for p in $(ps -o pid= --ppid "$1"); do job_tree "$p"; done
}

# tcp_inside PID...: echoes how many established TCP connections these
# processes hold; fails unless there are some and each one's other end is held
# by one of them too (nothing connects the job to a process outside it).
tcp_inside() {
  ss -tanpH state established | "$PY" -c '
import re, sys
pids = set(sys.argv[1:])
norm = lambda a: re.sub(r"^\[(::ffff:)?(.*)\](:\d+)$", r"\2\3", a)
mine = [(norm(f[2]), norm(f[3])) for f in map(str.split, sys.stdin)
        if len(f) >= 5 and pids & set(re.findall(r"pid=(\d+)", " ".join(f[4:])))]
ours = {l for l, _ in mine}
out = [f"{l} -> {p}" for l, p in mine if p not in ours]
if not mine or out:
    sys.exit("no established connections" if not mine else "connected outside the job: " + ", ".join(out))
print(len(mine))' "$@"
}

# torch 1.13's torchrun needs --redirects/--tee on Python 3.11 (without them it
# fails parsing its defaults); USE_LIBUV=0 keeps newer torch's TCPStore on the
# same (non-libuv) server as 1.13's. Not --standalone: it puts the rendezvous
# store on the fixed port 29400 and, when that is taken (another torchrun on
# the machine), silently joins that job's store as a client, so the job would
# hold a connection to a process outside it. Here the agent must host the store
# itself (is_host=1), on a port the kernel picks.
LAUNCH_OUT=$T/launch.out
"$CUSNAP" launch --strict --name tr -- env USE_LIBUV=0 "$PY" -m torch.distributed.run \
  --nnodes 1 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:0 --rdzv_id tr --rdzv_conf is_host=1 \
  --redirects 1 --tee 1 --nproc_per_node 2 \
  "$WORKLOAD" --backend gloo --mib 1 --print-every "$EVERY" >"$LAUNCH_OUT" 2>&1 &
SUPERVISORS+=($!)
SUP=$!
for p in "${PREFIXES[@]}"; do wait_count "$LAUNCH_OUT" "$EVERY" "$p" 60; done
PID=$(wait_job tr)
ready_pids "$LAUNCH_OUT" >>"$T/job-pids"
[ "$(ready_pids "$LAUNCH_OUT" | wc -l)" = 2 ] || fail "expected 2 ranks ready: $(grep ready "$LAUNCH_OUT")"
mapfile -t TREE < <( (echo "$PID"; ready_pids "$LAUNCH_OUT") | sort -n)
[ "$(job_tree "$PID" | sort -n | paste -sd' ')" = "${TREE[*]}" ] ||
  fail "the job is not the agent $PID and its two ranks: $(job_tree "$PID" | paste -sd' ')"
CONNS=$(tcp_inside "${TREE[@]}") || fail "the job's TCP connections are not all inside it"
pass "torchrun agent $PID, ranks $(ready_pids "$LAUNCH_OUT" | tr '\n' ' ')counting; $CONNS TCP connections between them"

CUR=$LAUNCH_OUT
for c in 1 2 3; do
  checkpoint_restore_cycle tr 0 "$CUR" "$c"
  CUR=$T/restore-$c.out
  "$PY" - "$T/ckpt-$c/manifest.json" <<'PY' || fail "cycle $c: the manifest does not record the TCP connections"
import json, sys
assert json.load(open(sys.argv[1])).get("tcp_established") is True
PY
  for k in "${!PREFIXES[@]}"; do
    first=$(first_count "$CUR" "${PREFIXES[k]}")
    [ "$first" = $((LAST[k] + EVERY)) ] ||
      fail "cycle $c: rank $k stopped at ${LAST[k]} and went on at $first, expected $((LAST[k] + EVERY))"
  done
  if grep -E "ready pid|MISMATCH" "$CUR"; then fail "cycle $c: a rank started again or found a wrong result"; fi
  [ "$(job_field tr pid)" = "$PID" ] || fail "cycle $c: the restored job's root is $(job_field tr pid), not $PID"
  [ "$(job_tree "$PID" | sort -n | paste -sd' ')" = "${TREE[*]}" ] ||
    fail "cycle $c: the restored processes are $(job_tree "$PID" | paste -sd' '), not ${TREE[*]}"
  [ "$(tcp_inside "${TREE[@]}")" = "$CONNS" ] || fail "cycle $c: the job does not hold its $CONNS TCP connections again"
  pass "cycle $c: same agent and ranks, counting on from ${LAST[0]} and ${LAST[1]}, every result right"
done

if grep -H MISMATCH "$LAUNCH_OUT" "$T"/restore-*.out; then fail "a rank found a wrong result"; fi
stop_job "$CUR"
for p in "${TREE[@]}"; do wait_gone "$p" 20; done
[ -z "$(job_pids_all)" ] || fail "cusnap ps still lists a job: $("$CUSNAP" ps 2>&1)"
pass "stopped; no process of the job is left"
echo "PASS"
