// What a CRIU dump of a job with established TCP connections leaves in place
// when it does not end in its own unlock, and taking it away again.
//
// Dumping such a job (--tcp-established), CRIU puts each connection's socket
// into repair mode (TCP_REPAIR: the socket neither sends nor accepts data)
// and drops the connections' packets: with --network-lock nftables through an
// nftables table "inet CRIU-<run id>" (run id: a UUID CRIU logs as "CRIU run
// id = ...", cut short in the name: criu_nft_tables), with iptables through
// two rules per connection (criu_iptables_unlock_commands). CRIU lifts both
// itself when a dump fails, or when the job is to run on (--leave-running).
// It leaves both in place when
//   - it succeeded under --leave-stopped (the job is to be killed and
//     restored: a restore of the checkpoint removes the lock), or
//   - it was killed (a timeout, or a guardian ending the CRIU of a dead
//     supervisor).
// A job that then runs on anyway (a checkpoint rolled back after the dump, a
// guardian's recovery) would find every connection dead: a send fails with
// EINVAL and nothing arrives. lift_criu_network_lock undoes both.
#pragma once

#include <sys/types.h>

#include <cctype>
#include <string>
#include <string_view>
#include <vector>

#include "coord/procs.h"

namespace cusnap {

/// A CRIU run id as CRIU prints it (uuid_unparse): 8-4-4-4-12 hexadecimal
/// digits. Inline: the manifest's reader checks one with it, and its fuzz
/// harness builds without this file's netlink code.
inline bool is_criu_run_id(std::string_view s) {
  if (s.size() != 36) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? s[i] != '-' : !std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}
/// The run id in the text of a CRIU log ("CRIU run id = <UUID>", logged at
/// level info near its start); empty when there is none or it is not a UUID.
std::string criu_run_id_from_log(std::string_view log_text);

/// The same from the log file at path (its first MiB); empty when the file
/// cannot be read or holds no run id.
std::string criu_run_id(const std::string& path);

/// The names the nftables table of CRIU's run run_id may have: CRIU 4.1
/// truncates "inet CRIU-<run id>" to 31 characters ("CRIU-" and 21 of the
/// id's 36), first; then the whole name, which a CRIU without that limit
/// would use.
std::vector<std::string> criu_nft_tables(const std::string& run_id);

/// Removes the nftables table of CRIU's run run_id (criu_nft_tables), asking
/// nf_tables over netlink itself (no nft program or libnftables needed: a
/// CRIU may bring its own, as scripts/gpu-bundle.sh's does). True when no
/// such table is left, *removed naming the one removed (empty when there was
/// none); false with *err saying why (no permission: CAP_NET_ADMIN is
/// needed).
bool remove_criu_nft_table(const std::string& run_id, std::string* removed, std::string* err);

/// The commands (program, then arguments) that delete the rules CRIU's
/// --network-lock iptables inserted for these sockets: for each established
/// one, a rule in INPUT dropping the peer's packets and one in OUTPUT
/// dropping its own, except those marked 0xC114 (CRIU's), as CRIU's
/// netfilter.c writes them, with -D for its -I. ip6tables for IPv6, except
/// between IPv4-mapped addresses, which CRIU locks through iptables. Sockets
/// in other states are not locked and get none. Each waits up to
/// lock_wait_s seconds for the xtables lock (-w).
std::vector<std::vector<std::string>> criu_iptables_unlock_commands(
    const std::vector<TcpTableEntry>& sockets, int lock_wait_s = 5);

/// For a job that runs on after a dump that did not unlock: removes CRIU's
/// lock (method: the --network-lock given; for nftables the table named by
/// the run id in the dump's log at log_path) and takes the job's sockets out
/// of repair mode. Returns what it did or could not do, one line each (empty
/// when there was nothing to do); a line that begins with "warning: " says
/// what is left for the user.
std::string lift_criu_network_lock(const std::vector<pid_t>& pids, const std::string& method,
                                   const std::string& log_path);

}  // namespace cusnap
