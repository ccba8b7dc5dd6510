#!/bin/bash
# no_guards_test.sh SHIM: the shim has no guard variable of its own (a
# function-local static made on first use). A fork child inherits such a
# guard held by a parent's thread that was making the value, and would wait
# forever on its first use; the shim makes such values with OnceNumber and
# OncePointer (src/shim/once.h) instead. Only the guards listed in `allowed`
# (libraries' namespace-scope values, made while the shim is loaded, before
# any thread) may be there.
set -euo pipefail
shim=$1
syms=$(nm -C "$shim") || { echo "FAIL: nm -C $shim failed"; exit 1; }
if [[ $(grep -c . <<< "$syms") -lt 100 ]]; then
  echo "FAIL: nm -C $shim lists almost no symbols (stripped?): nothing to check"
  exit 1
fi
allowed='^guard variable for boost::none$'
guards=$(sed -n 's/^[0-9a-f]* [a-zA-Z] \(guard variable for .*\)/\1/p' <<< "$syms")
if bad=$(grep -v -E -e "$allowed" -e '^$' <<< "$guards"); then
  echo "$bad"
  echo "FAIL: the shim has statics made on first use (above); use src/shim/once.h"
  exit 1
fi
echo "no guard variables of the shim's ($(grep -c . <<< "$guards") allowed: libraries' namespace-scope values)"
