#include "coord/abs_path.h"

#include <filesystem>

namespace cusnap {

bool absolute_path(const std::string& p, std::string* out, std::error_code* ec) {
  namespace fs = std::filesystem;
  const fs::path abs = fs::absolute(p, *ec);
  if (*ec) return false;
  // Up to the last '..' the file system says where the path leads; the rest
  // is only tidied.
  fs::path head, tail;
  for (const fs::path& c : abs) {
    tail /= c;
    if (c == "..") {
      head /= tail;
      tail.clear();
    }
  }
  fs::path whole = abs;
  if (!head.empty()) {
    std::error_code resolve;
    const fs::path there = fs::weakly_canonical(head, resolve);
    if (!resolve) whole = there / tail;  // unreadable: taken as written
  }
  std::string s = whole.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  *out = s;
  return true;
}

}  // namespace cusnap
