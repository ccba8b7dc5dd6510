// The one unit-test binary: every *_test.cpp registered by a subdirectory
// links into it.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
