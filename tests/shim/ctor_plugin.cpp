// A library whose constructor calls the driver after 300 ms of start-up work,
// the dynamic loader's lock held all along: shim.track.app's loader case.
#include <cuda.h>
#include <unistd.h>

extern "C" {
__attribute__((visibility("default"))) int cusnap_test_plugin_result = -1;
}

__attribute__((constructor)) static void plugin_init() {
  ::usleep(300 * 1000);
  int v = 0;
  cusnap_test_plugin_result = cuDriverGetVersion(&v);
}
