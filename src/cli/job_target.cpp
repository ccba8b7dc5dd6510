#include "job_target.h"

#include <cstdio>

namespace cusnap::cli {

void add_job_argument(CLI::App& app, std::string* job) {
  app.add_option("JOB", *job, "Job name, pid (PID or SUPERV of cusnap ps) or runtime directory")
      ->required()
      ->check(not_empty())
      ->type_name("");
}

int resolve_job(const std::string& spec, bool json, JobEntry* out) {
  std::string err;
  bool unusable_base = false;
  if (find_job(spec, out, &err, &unusable_base)) return -1;
  if (unusable_base)  // what to do, as cusnap ps says it
    return fail_json(json, kExitFailure,
                     err +
                         ": move it away, or set CUSNAP_RUNTIME_BASE to the runtime base the "
                         "job was launched with");
  // A number is looked up as a name and as both pids of ps.
  if (spec.find('/') == std::string::npos &&
      spec.find_first_not_of("0123456789") == std::string::npos)
    err = "no job named " + spec + ", nor with PID or SUPERV " + spec +
          ", is running (cusnap ps lists the running jobs)";
  return fail_json(json, kExitNotFound, err);
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

void print_cut(const nlohmann::json& d) {
  if (d.contains("collective_cut") && d["collective_cut"].is_object()) {
    std::string ranks;
    for (auto& [pid, n] : d["collective_cut"].items())
      if (n.is_number_unsigned())
        ranks += (ranks.empty() ? "" : ", ") + std::string("process ") + pid + " at " +
                 std::to_string(n.get<uint64_t>());
    std::printf("collective cut: %s collective launches\n", ranks.c_str());
  }
  if (int n = d.value("capture_retries", 0); n > 0)
    std::printf("waited for a CUDA stream capture to end: the device was drained at attempt %d\n",
                n + 1);
}

}  // namespace cusnap::cli
