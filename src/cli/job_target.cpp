#include "job_target.h"

#include <cstdio>

namespace cusnap::cli {

int resolve_job(const std::string& spec, bool json, JobEntry* out) {
  std::string err;
  if (!find_job(spec, out, &err)) return fail_json(json, kExitNotFound, err);
  return -1;
}

int report_result_failure(bool json, const proto::Result& r) {
  int code = r.exit_code == kExitOk ? kExitFailure : r.exit_code;
  return fail_json(json, code, r.message.empty() ? "the operation failed" : r.message);
}

void print_phases(const nlohmann::json& phases) {
  for (const auto& p : phases) {
    std::printf("  %-24s %8.2f s\n", p.value("name", std::string("?")).c_str(),
                p.value("seconds", 0.0));
  }
}

}  // namespace cusnap::cli
