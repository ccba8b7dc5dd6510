// The simulated devices from the environment (see device_env.h).
#include "device_env.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace fc {

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

unsigned long long env_u64(const char* name, unsigned long long def) {
  const char* v = getenv(name);
  if (!v || !*v) return def;
  char* end = nullptr;
  unsigned long long r = strtoull(v, &end, 0);
  return (end && *end == '\0') ? r : def;
}

DeviceEnv read_device_env() {
  DeviceEnv e;
  unsigned long long count = env_u64("FAKECUDA_DEVICES", 1);
  e.count =
      count > static_cast<unsigned long long>(kMaxDevices) ? kMaxDevices : static_cast<int>(count);
  const char* name = getenv("FAKECUDA_DEVICE_NAME");
  e.name = (name && *name) ? name : kDefaultDeviceName;
  e.total_mem = env_u64("FAKECUDA_TOTAL_MEM", kDefaultTotalMem);
  e.seed = env_u64("FAKECUDA_UUID_SEED", 0);
  return e;
}

void device_uuid(int index, uint64_t seed, unsigned char out[16]) {
  uint64_t x = seed * 1000003ULL + static_cast<uint64_t>(index) + 0xfa4ec0daULL;
  uint64_t a = splitmix64(x), b = splitmix64(x);
  memcpy(out, &a, 8);
  memcpy(out + 8, &b, 8);
  out[6] = static_cast<unsigned char>((out[6] & 0x0f) | 0x40);  // RFC 4122 version 4 shape
  out[8] = static_cast<unsigned char>((out[8] & 0x3f) | 0x80);
}

std::vector<int> visible_devices(int count, uint64_t seed) {
  std::vector<int> all;
  for (int i = 0; i < count; ++i) all.push_back(i);
  const char* v = getenv("CUDA_VISIBLE_DEVICES");
  if (!v) return all;
  std::vector<int> out;
  std::string list(v);
  size_t at = 0;
  while (at <= list.size()) {
    size_t end = list.find(',', at);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(at, end - at);
    while (!item.empty() && item.front() == ' ') item.erase(0, 1);
    while (!item.empty() && item.back() == ' ') item.pop_back();
    int found = -1;
    if (!item.empty() && item.find_first_not_of("0123456789") == std::string::npos) {
      if (item.size() < 4 && std::stoi(item) < count) found = std::stoi(item);
    } else if (item.size() > 4 && item.compare(0, 4, "GPU-") == 0) {
      int matches = 0;
      for (int i = 0; i < count; ++i) {
        unsigned char u[16];
        device_uuid(i, seed, u);
        if (gpu_uuid_string(u).compare(0, item.size(), item) == 0) {
          found = i;
          ++matches;
        }
      }
      if (matches != 1) found = -1;
    }
    bool again = false;
    for (int i : out) again = again || i == found;
    if (found < 0 || again) break;
    out.push_back(found);
    at = end + 1;
  }
  return out;
}

std::string gpu_uuid_string(const unsigned char b[16]) {
  char s[48];
  snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
           b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
           b[14], b[15]);
  return s;
}

}  // namespace fc
