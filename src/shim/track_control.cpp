// The control listener's requests (its socket, one per process, which the
// coordinator and its tests use): inspect, the gate's close and open, the
// drain, the save, load, release and reimport of shared memory, and the
// cut; and the gate a client closed, opened again when no client looks after
// it any more (GateHold, track_listener.h).
#include <algorithm>
#include <cerrno>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "proto/control.h"
#include "proto/env_settings.h"
#include "proto/wire.h"
#include "shim/cusnap_shim.h"
#include "shim/cut.h"
#include "shim/cut_control.h"
#include "shim/entries.h"
#include "shim/gate.h"
#include "shim/stderr_line.h"
#include "shim/track_listener.h"
#include "shim/track_state.h"

namespace cusnap::shim::track {

namespace {

/// The longest a gate-close waits for the calls in flight, whatever it asks:
/// the coordinator asks for its phase, the timeout of the checkpoint or
/// suspend, which is at most proto::kMaxTimeoutMs (a week). A larger value,
/// sent by hand, would keep this listener (every other client, the
/// coordinator included) in the close that much longer.
constexpr uint64_t kMaxGateCloseMs = proto::kMaxTimeoutMs;

/// "still in the driver: cuStreamSynchronize (2 threads), ..." for a close
/// that timed out (the calls that kept it from draining are usually still
/// in flight right after it).
std::string calls_in_flight() {
  uint32_t what[64];
  const size_t n = gate().in_flight_calls(what, 64);
  std::map<std::string, int> names;
  for (size_t i = 0; i < n; ++i) {
    const char* name = what[i] > 0 ? entry_name(what[i] - 1) : nullptr;
    ++names[name ? name : "a driver call"];
  }
  std::string out;
  for (auto& [name, k] : names)
    out += (out.empty() ? "" : ", ") + name + (k > 1 ? " (" + std::to_string(k) + " threads)" : "");
  return out.empty() ? out : "still in the driver: " + out;
}

bool gate_closed() {
  int closed = 0;
  if (auto f = cusnap_shim_build_info.control->gate_state) f(&closed, nullptr, nullptr);
  return closed != 0;
}

}  // namespace

bool serve_control(State& s, Conn& c, GateHold& hold) {
  proto::Message msg;
  ListedFd brought;  // the descriptor that came with it
  std::string err;
  bool refused = false;
  if (!recv_request(c, &msg, &brought, &err, &refused)) {
    if (!refused) return false;
    // A client of another version, or a broken one, is told why; the
    // connection stays open, as for an unknown request.
    proto::Done d;
    d.error = "request refused: " + err;
    return reply(c, proto::kMsgDone, d);
  }
  bool sent;
  if (msg.type == proto::kMsgShimInspect) {
    sent = reply(c, proto::kMsgShimRecords, snapshot(s));
  } else if (msg.type == proto::kMsgGateClose) {
    proto::GateRequest g;
    proto::Done d;
    if (!msg.get(&g, &err)) {
      d.error = err;
    } else {
      d.code = cusnap_shim_build_info.control->gate_close(std::min(g.timeout_ms, kMaxGateCloseMs));
      d.ok = d.code == 0;
      if (d.code == ETIMEDOUT) d.error = calls_in_flight();
      if (d.ok) {
        hold.closed_by_client = true;
        hold.released = false;
      }
    }
    sent = reply(c, proto::kMsgDone, d);
  } else if (msg.type == proto::kMsgGateOpen) {
    proto::Done d;
    proto::GateOpen req;
    std::string why;
    const bool keep_cut = msg.get(&req, &why) && req.keep_cut;
    d.code = cusnap_shim_build_info.control->gate_open();
    if (!keep_cut) cut::release();  // held collective launches go on once the gate is open
    d.ok = d.code == 0 || d.code == EALREADY;
    hold.closed_by_client = hold.released = false;
    sent = reply(c, proto::kMsgDone, d);
  } else if (msg.type == proto::kMsgShimDrain) {
    // Only once the gate holds the application's threads: meanwhile they
    // begin stream captures and destroy contexts under the drain. On a
    // thread of its own, bounded: this listener must stay free to open the
    // gate (drain_thread.cpp). A request that names no time (0: an older
    // client's, "until it has finished") is bounded by the gate's hold: no
    // longer than the shim lets a gate stay closed with nobody to open it,
    // which is what the listener stuck in the drain would make it.
    proto::DrainRequest req;
    proto::Done d;
    if (!msg.get(&req, &err))
      d.error = err;
    else if (!gate_closed())
      d.error = "the gate is open: close it first";
    else
      d = drain_within(s, req.timeout_ms != 0 ? req.timeout_ms : hold.hold_ms());
    sent = reply(c, proto::kMsgDone, d);
  } else if (msg.type == proto::kMsgShimSave || msg.type == proto::kMsgShimLoad) {
    // One descriptor per message: parts 0..parts-2 are held, the last runs it.
    proto::AllocationRequest req;
    proto::Done d;
    if (!msg.get(&req, &err)) {
      d.error = err;
    } else if (!brought) {
      d.error = "no file descriptor came with the request";
    } else if (!gate_closed()) {
      d.error = "the gate is open: close it first";
    } else if (req.parts == 0 || req.parts > proto::kMaxParts || req.part >= req.parts ||
               req.part != c.parts.size() ||
               (!c.parts.empty() && (c.parts_of != req.allocation || c.parts_type != msg.type))) {
      d.error =
          "part " + std::to_string(req.part) + " of " + std::to_string(req.parts) + " out of order";
    } else {
      c.parts_of = req.allocation;
      c.parts_type = msg.type;
      c.parts.push_back(std::move(brought));
      if (c.parts.size() < req.parts) {
        d.ok = true;
      } else {
        // Each part's number must still name the file that came: the
        // application may have closed and reused one while they arrived.
        std::vector<int> fds;
        for (auto& f : c.parts)
          if (f.ours()) fds.push_back(f.get());
        if (fds.size() < c.parts.size())
          d.error = "the descriptor of a part was closed in the process";
        else
          d = msg.type == proto::kMsgShimSave ? save_allocation(s, req.allocation, fds)
                                              : load_allocation(s, req.allocation, fds);
        c.parts.clear();
        // The last released allocation loaded again: as after a reimport.
        if (d.ok && hold.released && !shared_released(s)) hold.released = false;
      }
    }
    if (!d.ok) c.parts.clear();
    sent = reply(c, proto::kMsgDone, d);
  } else if (msg.type == proto::kMsgShimRelease) {
    proto::ReleaseRequest req;
    proto::Done d;
    if (!msg.get(&req, &err)) {
      d.error = err;
    } else if (!gate_closed()) {
      d.error = "the gate is open: close it first";
    } else {
      d = release_shared(s, req.origin);
      // From here on only a gate-open lets the threads on, if memory is
      // gone (or marked to go: release_shared marks before it releases): a
      // release that found nothing of this process shared leaves the gate
      // to its hold.
      if (shared_released(s)) hold.released = true;
    }
    sent = reply(c, proto::kMsgDone, d);
  } else if (msg.type == proto::kMsgShimCut) {
    proto::CutRequest req;
    proto::CutState st;
    if (!msg.get(&req, &err)) {
      st.error = err;
    } else {
      st = cut::handle(req);
      if (req.op == "arm" && st.ok)
        hold.armed_hold_ms =
            req.hold_ms < proto::kMaxCutHoldMs ? req.hold_ms : proto::kMaxCutHoldMs;
    }
    sent = reply(c, proto::kMsgShimCutState, st);
  } else if (msg.type == proto::kMsgShimReimport) {
    proto::Done d = gate_closed() ? reimport_shared(s) : proto::Done{};
    if (!d.ok && d.error.empty()) d.error = "the gate is open: close it first";
    // Memory brought back: nothing guards the gate any more but its hold.
    if (d.ok && hold.released && !shared_released(s)) hold.released = false;
    sent = reply(c, proto::kMsgDone, d);
  } else {
    proto::Done d;
    d.error = "unknown request '" + msg.type + "'";
    sent = reply(c, proto::kMsgDone, d);
  }
  return sent;
}

void open_unattended_gate(GateHold& hold, bool connections, Clock::time_point now) {
  if (connections) hold.contact = now;
  if (!hold.pending() || connections || now < hold.expiry()) return;
  hold.closed_by_client = false;
  if (!gate_closed()) return;  // opened in the process meanwhile
  cusnap_shim_build_info.control->gate_open();
  cut::release();
  say("the gate stayed closed %llu ms after its client went away; it is opened and the "
      "application goes on",
      static_cast<unsigned long long>(hold.hold_ms()));
}

void control_listener_ended(const GateHold& hold, const char* why) noexcept {
  cut::release();
  if (!hold.closed_by_client || !gate_closed()) return;
  if (hold.released) {
    say("the control socket's listener ended (%s) with the gate closed after a release of "
        "shared memory; no coordinator can rebuild it now, so the gate stays closed",
        why);
    return;
  }
  cusnap_shim_build_info.control->gate_open();
  say("the control socket's listener ended (%s) with the gate closed by a client; it is opened "
      "and the application goes on",
      why);
}

}  // namespace cusnap::shim::track
