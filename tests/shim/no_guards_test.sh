#!/bin/bash
# no_guards_test.sh SHIM: the shim has no guard variable of its own (a
# function-local static made on first use). A fork child inherits such a
# guard held by a parent's thread that was making the value, and would wait
# forever on its first use; the shim makes such values with OnceNumber and
# OncePointer (src/shim/once.h) instead. Guards of libraries' namespace-scope
# values (made while the shim is loaded, before any thread) are allowed.
set -euo pipefail
shim=$1
syms=$(nm -C "$shim") || { echo "FAIL: nm -C $shim failed"; exit 1; }
if [[ $(grep -c . <<< "$syms") -lt 100 ]]; then
  echo "FAIL: nm -C $shim lists almost no symbols (stripped?): nothing to check"
  exit 1
fi
if grep -E 'guard variable for cusnap::' <<< "$syms"; then
  echo "FAIL: the shim has function-local statics made on first use (above); use src/shim/once.h"
  exit 1
fi
echo "no guard variables of the shim's ($(grep -c 'guard variable' <<< "$syms") of libraries' namespace-scope values)"
