#include "coord/restore_report.h"

#include "proto/control.h"
#include "proto/json_text.h"

namespace cusnap {

namespace {

nlohmann::json moves_json(const RestoreSummary& s) {
  nlohmann::json moves = nlohmann::json::array();
  for (const auto& [from, to] : s.gpu_moves) moves.push_back({{"from", from}, {"to", to}});
  return moves;
}

}  // namespace

nlohmann::json restored_json(const RestoreSummary& s, bool detached) {
  nlohmann::json phases = nlohmann::json::array();
  for (const auto& [n, secs] : s.phases) phases.push_back({{"name", n}, {"seconds", secs}});
  return {{"ok", true},
          {"name", s.name},
          {"dir", s.dir},
          {"pid", s.root_pid > 0 ? nlohmann::json(s.root_pid) : nlohmann::json(nullptr)},
          {"runtime_dir", s.runtime_dir},
          {"phases", phases},
          {"gpu_moves", s.gpu_moves_known ? moves_json(s) : nlohmann::json(nullptr)},
          {"detached", detached}};
}

std::string gpu_moves_text(const RestoreSummary& s) {
  std::string text;
  for (const auto& [from, to] : s.gpu_moves)
    text += "cusnap: the job's GPU " + from + " is now GPU " + to + "\n";
  return text;
}

std::optional<RestoreSummary> summary_left_to_report(const SuperviseOutcome& out, bool reported,
                                                     const RestoreSummary& known) {
  if (reported || !out.error.empty() || !out.detached) return std::nullopt;
  return known;
}

std::string summary_to_json(const RestoreSummary& s) {
  nlohmann::json phases = nlohmann::json::array();
  for (const auto& [n, secs] : s.phases) phases.push_back({{"name", n}, {"seconds", secs}});
  return json_text(nlohmann::json{{"name", s.name},
                                  {"dir", s.dir},
                                  {"runtime_dir", s.runtime_dir},
                                  {"root_pid", s.root_pid},
                                  {"phases", phases},
                                  {"gpu_moves", moves_json(s)}});
}

bool summary_from_json(const std::string& text, RestoreSummary* s) {
  try {
    auto j = nlohmann::json::parse(text);
    s->name = j.at("name");
    s->dir = j.at("dir");
    s->runtime_dir = j.at("runtime_dir");
    s->root_pid = j.at("root_pid");
    for (const auto& p : j.at("phases")) s->phases.emplace_back(p.at("name"), p.at("seconds"));
    for (const auto& g : j.at("gpu_moves")) s->gpu_moves.emplace_back(g.at("from"), g.at("to"));
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

std::string detached_outcome_unknown(const std::string& name, const std::string& dir,
                                     const std::string& why) {
  const std::string job = name.empty() ? "the job" : "job " + name;
  return "the background restore ended without a result (" + why + "): whether " + job +
         " was restored from " + dir +
         " is not known; cusnap ps lists it if it runs, and cusnap inspect " +
         (name.empty() ? std::string("NAME") : name) + " shows its processes";
}

SuperviseOutcome await_detached_restore(
    proto::Channel& ch, const ProgressSink& progress,
    const std::function<void(const RestoreSummary&)>& on_restored, const std::string& name,
    const std::string& dir) {
  SuperviseOutcome out;
  out.name = name;
  auto unknown = [&](const std::string& why) {
    out.exit_code = kExitFailure;
    out.error = detached_outcome_unknown(name, dir, why);
    return out;
  };
  for (;;) {
    proto::Message msg;
    std::string err;
    if (!ch.recv(&msg, &err)) return unknown(err);
    if (msg.type == proto::kMsgProgress) {
      proto::ProgressEvent ev;
      if (progress && msg.get(&ev, &err))
        progress(Progress{ev.phase, ev.bytes_done, ev.bytes_total});
      continue;
    }
    proto::Result r;
    if (msg.type != proto::kMsgResult || !msg.get(&r, &err))
      return unknown("it sent an unexpected '" + msg.type + "' message");
    if (!r.ok) {
      out.exit_code = r.exit_code == kExitOk ? kExitFailure : r.exit_code;
      out.error = r.message;
      return out;
    }
    RestoreSummary s;
    if (summary_from_json(r.details, &s)) {
      out.name = s.name;
      if (on_restored) on_restored(s);
    }
    out.detached = true;
    out.exit_code = kExitOk;
    return out;
  }
}

}  // namespace cusnap
