#!/usr/bin/env bash
# check-man-pages.sh CUSNAP MANDIR: the options of each subcommand's --help
# (CLI11's parser: every option it accepts) and of its man page are the same
# set, and its SYNOPSIS names none other; each default --help states is the
# one the page states; cusnap.1 names every subcommand, every exit status of
# the ExitCode enum, and every CUSNAP_* variable that the cusnap binary's
# sources (src/cli, src/coord, src/proto) read, bar those only the shim
# reads, which docs/shim.md documents.
set -euo pipefail
cusnap=$1 mandir=$2
srcdir=$(cd "$mandir/.." && pwd)
status=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

help_options() {  # long and short options in --help, one per line
  "$cusnap" "$1" --help | grep -E '^  -' | grep -oE '(^|[ ,])--?[a-z][a-z-]*' | tr -d ' ,' | sort -u
}
page_options() {  # options in the page's OPTIONS section
  sed -n '/^\.SH OPTIONS/,/^\.SH /p' "$1" | grep -E '^\.(B|BR|BI) ' |
    sed -e 's/\\-/-/g' -e 's/"[^"]*"//g' | grep -oE '(^|[ ])--?[a-z][a-z-]*' | tr -d ' ' | sort -u
}
synopsis_options() {  # options the page's SYNOPSIS names for cusnap CMD
  sed -n '/^\.SH SYNOPSIS/,/^\.SH /p' "$1" | sed -e 's/\\-/-/g' -e 's/"[^"]*"//g' |
    grep -oE '(^|[ []|)--?[a-z][a-z-]*' | tr -d ' [' | sort -u
}
# The page as text, one line per paragraph, no hyphenation (groff).
render() { groff -man -Tascii -P-cbou -rLL=5000n -rHY=0 "$1" 2>/dev/null; }
command -v groff >/dev/null || { echo "FAIL: no groff (scripts/install-deps.sh installs groff-base): the defaults cannot be compared"; exit 1; }

for cmd in launch checkpoint restore suspend resume ps inspect; do
  page="$mandir/cusnap-$cmd.1"
  [ "$cmd" = resume ] && page="$mandir/cusnap-suspend.1"
  [ -f "$page" ] || { echo "missing page for $cmd"; status=1; continue; }
  help_options "$cmd" >"$tmp/help"
  if ! diff "$tmp/help" <(page_options "$page") >"$tmp/diff"; then
    echo "cusnap $cmd: --help (<) and $(basename "$page") (>) differ:"; cat "$tmp/diff"; status=1
  fi
  for o in $(synopsis_options "$page"); do
    grep -qxF -- "$o" "$tmp/help" ||
      { echo "$(basename "$page"): SYNOPSIS names $o, which cusnap $cmd does not take"; status=1; }
  done
  # "(default: X)" of an option in --help is in that option's entry of the page.
  {
    render "$page" >"$tmp/page"
    "$cusnap" "$cmd" --help | grep -E '^  -' | while IFS= read -r line; do
      def=$(printf '%s\n' "$line" | grep -oE '\(default: [^);]*' | head -1 | sed 's/^(//') || true
      [ -n "$def" ] || continue
      opt=$(printf '%s\n' "$line" | grep -oE -- '--[a-z][a-z-]*' | head -1)
      # The entry: from the line that starts with the option to the next one.
      entry=$(awk -v o="$opt" '
        /^[A-Z]/ { options = ($0 == "OPTIONS"); inside = 0 }
        options && /^       -/ { inside = (index($0 " ", o " ") > 0 || index($0, o ",") > 0) }
        inside' "$tmp/page" | tr -s ' ')
      grep -qF -- "$(tr -s ' ' <<<"$def")" <<<"$entry" ||
        { echo "cusnap $cmd $opt: --help says '$def', $(basename "$page") does not"; echo x >>"$tmp/bad"; }
    done
    [ ! -e "$tmp/bad" ] || { status=1; rm -f "$tmp/bad"; }
  }
  grep -q "^\.B.* $cmd\b\|^\.B $cmd$\|^\.BR .*$cmd" "$mandir/cusnap.1" || { echo "cusnap.1 lacks $cmd"; status=1; }
  # Every command exits 2 for a bad command line; its page says so.
  sed -n '/^\.SH EXIT STATUS/,/^\.SH /p' "$page" | grep -qw 2 ||
    { echo "$(basename "$page") does not list exit status 2 (bad command line)"; status=1; }
done

# Every exit code of the enum (src/coord/engine.h) is documented.
codes=$(sed -n '/^enum ExitCode/,/^};/p' "$srcdir/src/coord/engine.h" | grep -oE '= *[0-9]+' | tr -dc '0-9\n')
[ -n "$codes" ] || { echo "no ExitCode enum found in $srcdir/src/coord/engine.h"; status=1; }
for code in $codes; do
  grep -q "^\.B $code$" "$mandir/cusnap.1" || { echo "cusnap.1 lacks exit status $code"; status=1; }
done

# Every CUSNAP_* setting the binary reads is in cusnap.1's ENVIRONMENT, bar
# the shim's own, which cusnap only passes on or looks for in a job's
# environment (docs/shim.md documents them).
shim_only="CUSNAP_RUNTIME_DIR CUSNAP_SHIM_TRACK"
sed -n '/^\.SH ENVIRONMENT/,/^\.SH /p' "$mandir/cusnap.1" | sed 's/\\-/-/g' >"$tmp/env"
for v in $(grep -rhoE '"CUSNAP_[A-Z0-9_]*[A-Z0-9]' --include='*.cpp' --include='*.h' \
             --exclude='*_test.cpp' "$srcdir/src/cli" "$srcdir/src/coord" "$srcdir/src/proto" |
           tr -d '"' | sort -u); do
  grep -qw -- "$v" "$tmp/env" && continue
  if [[ " $shim_only " == *" $v "* ]]; then
    grep -qw -- "$v" "$srcdir/docs/shim.md" ||
      { echo "docs/shim.md does not document $v, the shim's setting"; status=1; }
    continue
  fi
  echo "cusnap.1 (ENVIRONMENT) does not document $v, which cusnap reads"; status=1
done
exit $status
