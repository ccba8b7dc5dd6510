#!/usr/bin/env bash
# check-man-pages.sh CUSNAP MANDIR: the options of each subcommand's --help
# and of its man page are the same set; cusnap.1 names every subcommand.
set -euo pipefail
cusnap=$1 mandir=$2
status=0

help_options() {  # long and short options in --help, one per line
  "$cusnap" "$1" --help | grep -E '^  -' | grep -oE '(^|[ ,])--?[a-z][a-z-]*' | tr -d ' ,' | sort -u
}
page_options() {  # options in the page's OPTIONS section
  sed -n '/^\.SH OPTIONS/,/^\.SH /p' "$1" | grep -E '^\.(B|BR|BI) ' |
    sed -e 's/\\-/-/g' -e 's/"[^"]*"//g' | grep -oE '(^|[ ])--?[a-z][a-z-]*' | tr -d ' ' | sort -u
}
for cmd in launch checkpoint restore suspend resume ps inspect; do
  page="$mandir/cusnap-$cmd.1"
  [ "$cmd" = resume ] && page="$mandir/cusnap-suspend.1"
  [ -f "$page" ] || { echo "missing page for $cmd"; status=1; continue; }
  if ! diff <(help_options "$cmd") <(page_options "$page") >/tmp/man-diff.$$; then
    echo "cusnap $cmd: --help (<) and $(basename "$page") (>) differ:"; cat /tmp/man-diff.$$; status=1
  fi
  grep -q "^\.B.* $cmd\b\|^\.B $cmd$\|^\.BR .*$cmd" "$mandir/cusnap.1" || { echo "cusnap.1 lacks $cmd"; status=1; }
  # Every command exits 2 for a bad command line; its page says so.
  sed -n '/^\.SH EXIT STATUS/,/^\.SH /p' "$page" | grep -qw 2 ||
    { echo "$(basename "$page") does not list exit status 2 (bad command line)"; status=1; }
done
rm -f /tmp/man-diff.$$
# Every exit code of the enum is documented.
for code in 0 1 2 3 4 5 6; do
  grep -q "^\.B $code$" "$mandir/cusnap.1" || { echo "cusnap.1 lacks exit status $code"; status=1; }
done
exit $status
