#include "coord/restore_report.h"

namespace cusnap {

nlohmann::json restored_json(const RestoreSummary& s, bool detached) {
  nlohmann::json phases = nlohmann::json::array();
  for (const auto& [n, secs] : s.phases) phases.push_back({{"name", n}, {"seconds", secs}});
  return {{"ok", true},
          {"name", s.name},
          {"dir", s.dir},
          {"pid", s.root_pid > 0 ? nlohmann::json(s.root_pid) : nlohmann::json(nullptr)},
          {"runtime_dir", s.runtime_dir},
          {"phases", phases},
          {"detached", detached}};
}

std::optional<RestoreSummary> summary_left_to_report(const SuperviseOutcome& out, bool reported,
                                                     const RestoreSummary& known) {
  if (reported || !out.error.empty() || !out.detached) return std::nullopt;
  return known;
}

}  // namespace cusnap
