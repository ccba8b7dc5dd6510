# orphan_job SUPERVISOR: kills a job's supervisor (a background cusnap launch
# or restore of this shell) and its guardian together, leaving the job's
# processes running without either. Sourced; needs fail().
orphan_job() {
  local sup=$1 guardian= _
  for _ in $(seq 1 100); do
    guardian=$(pgrep -P "$sup" -x cusnap-guardian || true)
    [ -n "$guardian" ] && break
    sleep 0.05
  done
  [ -n "$guardian" ] || fail "no guardian under supervisor $sup"
  # Both stopped first: neither sees the other die and acts on it.
  kill -STOP "$guardian" "$sup"
  kill -KILL "$guardian" "$sup"
  wait "$sup" 2>/dev/null || true
}
