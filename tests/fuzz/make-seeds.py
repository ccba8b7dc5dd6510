#!/usr/bin/env python3
"""Writes the seed corpus of the fuzzers (tests/fuzz/corpus/) from scratch:
valid and near-valid control messages for fuzz_wire (first byte: path and
descriptors, see fuzz_wire.cpp) and manifests for fuzz_manifest."""
import json, os, struct, sys

here = os.path.dirname(os.path.abspath(__file__))

def mp(v):
    """A minimal MessagePack encoder: enough for the control messages."""
    if v is None: return b"\xc0"
    if v is True: return b"\xc3"
    if v is False: return b"\xc2"
    if isinstance(v, int):
        if 0 <= v < 128: return bytes([v])
        if -32 <= v < 0: return struct.pack("b", v)
        if v >= 0: return b"\xcf" + struct.pack(">Q", v)
        return b"\xd3" + struct.pack(">q", v)
    if isinstance(v, str):
        b = v.encode()
        if len(b) < 32: return bytes([0xa0 | len(b)]) + b
        return b"\xd9" + bytes([len(b)]) + b if len(b) < 256 else b"\xda" + struct.pack(">H", len(b)) + b
    if isinstance(v, list):
        return bytes([0x90 | len(v)]) + b"".join(mp(x) for x in v)
    if isinstance(v, dict):
        return bytes([0x80 | len(v)]) + b"".join(mp(k) + mp(x) for k, x in v.items())
    raise TypeError(v)

def body(t, payload, version=1): return mp([version, t, payload])
def frame(b): return struct.pack("<I", len(b)) + b

status = {"name": "job", "root_pid": 100, "supervisor_pid": 99, "argv": ["sleep", "9"], "cwd": "/",
          "owner_uid": 0, "started": 1, "state": "running", "runtime_dir": "/run/cusnap/job",
          "restored_from": ""}
msgs = {
    "hello": body("hello", {}),
    "inspect": body("inspect", {}),
    "checkpoint": body("checkpoint", {"dir": "/ckpt/a", "leave_running": True, "timeout_ms": 60000}),
    "suspend": body("suspend", {"timeout_ms": 1000}),
    "resume": body("resume", {"timeout_ms": 1000}),
    "status": body("hello", status),
    "progress": body("progress", {"phase": "dump", "bytes_done": 5, "bytes_total": 10}),
    "result": body("result", {"ok": False, "exit_code": 3, "message": "no", "details": "{}"}),
    "badversion": body("hello", {}, version=2),
    "badtimeout": body("suspend", {"timeout_ms": -1}),
    "relative": body("checkpoint", {"dir": "ckpt", "leave_running": False, "timeout_ms": 1}),
}
out = os.path.join(here, "corpus", "wire")
os.makedirs(out, exist_ok=True)
for name, b in msgs.items():
    open(os.path.join(out, "decode-" + name), "wb").write(b"\x01" + b)
    # Through a socket: split after the length, no descriptor / one on the first chunk.
    open(os.path.join(out, "chan-" + name), "wb").write(b"\x00\x03" + frame(b))
    open(os.path.join(out, "chan-fd-" + name), "wb").write(b"\x02\x03" + frame(b))
two = frame(msgs["hello"]) + frame(msgs["checkpoint"])
open(os.path.join(out, "chan-two"), "wb").write(b"\x00\x07" + two)
open(os.path.join(out, "chan-two-fds"), "wb").write(b"\x16\x07" + two)
open(os.path.join(out, "chan-huge-length"), "wb").write(b"\x00\x02" + struct.pack("<I", 0xffffffff) + b"x")
open(os.path.join(out, "chan-truncated"), "wb").write(b"\x00\x02" + frame(msgs["hello"])[:-2])

manifest = {
    "format": "cusnap-checkpoint", "version": 2, "created": "2026-01-01T00:00:00Z",
    "cusnap_version": "0.1.0",
    "job": {"name": "job", "argv": ["cusnap-pattern-job", "--mib", "4"], "cwd": "/", "owner_uid": 0,
            "root_pid": 100, "stdout_pipe": "pipe:[1]", "stderr_pipe": "pipe:[2]"},
    "processes": [{"pid": 100, "ppid": 99, "exe": "/bin/job", "cmdline": ["job"], "uses_cuda": True,
                   "gpus": ["GPU-00000000-0000-0000-0000-000000000000"]},
                  {"pid": 101, "ppid": 100, "exe": "/bin/job", "cmdline": ["job"], "uses_cuda": False,
                   "gpus": []}],
    "driver": {"version": 13000, "path": "/usr/lib/libcuda.so.1"},
    "gpus": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-00000000-0000-0000-0000-000000000000",
              "total_mem": 150754820096}],
    "criu": {"version": "4.1.1", "path": "/usr/local/sbin/criu"},
    "files": [{"path": "criu/pages-1.img", "size": 67108865, "chunk_size": 67108864,
               "sha256": "0" * 64, "chunks": ["1" * 64, "2" * 64]},
              {"path": "criu/core-100.img", "size": 12, "chunk_size": 67108864, "sha256": "a" * 64,
               "chunks": ["b" * 64]},
              {"path": "criu/empty.img", "size": 0, "chunk_size": 4096, "sha256": "c" * 64,
               "chunks": []}],
    "phases": [{"name": "check", "seconds": 0.01}, {"name": "dump", "seconds": 1.5}],
    "leave_running": False,
}
out = os.path.join(here, "corpus", "manifest")
os.makedirs(out, exist_ok=True)
open(os.path.join(out, "valid.json"), "w").write(json.dumps(manifest, indent=2) + "\n")
# The previous format: one SHA-256 per file, no chunks.
m = json.loads(json.dumps(manifest)); m["version"] = 1
for f in m["files"]: del f["chunk_size"], f["chunks"]
open(os.path.join(out, "version1.json"), "w").write(json.dumps(m))
m = json.loads(json.dumps(manifest)); m["files"][0]["chunks"].pop()
open(os.path.join(out, "chunkcount.json"), "w").write(json.dumps(m))
m = json.loads(json.dumps(manifest)); m["files"][0]["path"] = "../etc/passwd"
open(os.path.join(out, "escape.json"), "w").write(json.dumps(m))
m = json.loads(json.dumps(manifest)); m["processes"] = []
open(os.path.join(out, "noprocs.json"), "w").write(json.dumps(m))
m = json.loads(json.dumps(manifest)); m["job"]["root_pid"] = 2**40
open(os.path.join(out, "bigpid.json"), "w").write(json.dumps(m))
m = json.loads(json.dumps(manifest))
m["tcp_listeners"] = [
    {"family": 4, "addr": "127.0.0.1", "port": 28028, "reuseport": True, "reuseaddr": True},
    {"family": 6, "addr": "::", "port": 8000, "reuseport": False, "reuseaddr": True, "v6only": False}]
open(os.path.join(out, "listeners.json"), "w").write(json.dumps(m))
open(os.path.join(out, "truncated.json"), "w").write(json.dumps(manifest)[:300])
