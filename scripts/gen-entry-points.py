#!/usr/bin/env python3
"""Generates src/cudaapi/entry_points.inc and src/cudaapi/proc_table.inc from the
toolkit's driver API headers: cuda.h with cudaTypedefs.h, and cudaProfiler.h
(cuProfilerInitialize, cuProfilerStart, cuProfilerStop, which cuda.h does not
declare) with cudaProfilerTypedefs.h. The pairs are listed in HEADERS; their
rows are merged into one sorted list, and code that expands the rows with their
parameter lists includes every header of HEADERS (src/cudaapi/cuda_headers.h).

Left out: the graphics interop headers cudaGL.h, cudaEGL.h and cudaVDPAU.h
(with their *Typedefs.h) need the GL/EGL/VDPAU system headers. Their entry
points (cuGLGetDevices, cuGraphicsEGLRegisterImage, cuVDPAUGetDevice, ...) are
therefore in no list: the shim has no wrapper for them, and resolving one
through cuGetProcAddress or cudaGetDriverEntryPoint fails closed (null pointer,
CUDA_ERROR_NOT_SUPPORTED). (Direct linking or dlsym by name still reaches the
driver's own function, past the shim and its gate.)

entry_points.inc: one X-macro row for every function those headers declare,
under its exported symbol name (the names the driver library exports, legacy
versions and per-thread-stream variants included):
    CUSNAP_CU_ENTRY(symbol, (parameter list), (argument list))

proc_table.inc: what cuGetProcAddress resolves, one row per (name, version,
stream flavour) that the typedef headers name (PFN_<name>_v<version>[_ptds|_ptsz]):
    CUSNAP_CU_PROC("cuMemAlloc", 3020, CUSNAP_PROC_DEFAULT, cuMemAlloc_v2)
Each row says: a caller asking for "name" with a CUDA version >= version gets
symbol. The flavour is DEFAULT, PTDS (per-thread default stream) or PTSZ.

Usage: gen-entry-points.py [--cuda-include DIR] [--out DIR] [--check]
--check regenerates into memory from the same headers and exits 1 when the
checked-in files differ (ctest entry_points_up_to_date).
"""
import argparse, os, re, subprocess, sys

# (declarations header, PFN typedefs header), in the order their declarations
# are read; keep src/cudaapi/cuda_headers.h including the same headers.
HEADERS = [
    ("cuda.h", "cudaTypedefs.h"),
    ("cudaProfiler.h", "cudaProfilerTypedefs.h"),
]

def preprocess(header, include, defines):
    cmd = ["gcc", "-E", "-P", "-x", "c", "-I", include] + ["-D" + d for d in defines] + [header]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout

def declarations(text):
    flat = re.sub(r"\s+", " ", text)
    out = {}
    for m in re.finditer(r"\bCUresult (cu[A-Za-z0-9_]+) ?\(([^;{]*)\) ?[;{]", flat):
        name, params = m.group(1), m.group(2).strip()
        out.setdefault(name, params)
    return out

def split_params(params):
    if params in ("", "void"):
        return []
    parts, depth, cur = [], 0, ""
    for ch in params:
        if ch == "," and depth == 0:
            parts.append(cur.strip()); cur = ""; continue
        depth += ch in "([" ; depth -= ch in ")]"
        cur += ch
    parts.append(cur.strip())
    return parts

def param_name(p, i):
    m = re.search(r"\(\s*\*\s*(\w+)\s*\)", p)  # function pointer parameter
    if m:
        return m.group(1), p
    m = re.search(r"(\w+)\s*(\[[^\]]*\])*\s*$", p)
    words = re.findall(r"\w+", p)
    if m and len(words) >= 2 and not p.rstrip().endswith("*"):
        return m.group(1), p
    name = "a%d" % i  # unnamed parameter: give it one
    return name, p + " " + name

def entry_rows(decls):
    rows = []
    for name in sorted(decls):
        ps = split_params(decls[name])
        named = [param_name(p, i) for i, p in enumerate(ps)]
        plist = ", ".join(p for _, p in named) or "void"
        alist = ", ".join(n for n, _ in named)
        rows.append("CUSNAP_CU_ENTRY(%s, (%s), (%s))" % (name, plist, alist))
    return rows

def variant_order(sym, base):
    rest = sym[len(base):]
    rest = re.sub(r"_(ptds|ptsz)$", "", rest)
    if rest == "":
        return 1
    m = re.fullmatch(r"_v(\d+)", rest)
    return int(m.group(1)) if m else None

def proc_rows(typedefs_text, symbols):
    pfn = {}
    for m in re.finditer(r"PFN_(cu[A-Za-z0-9]+)_v(\d+)(_ptds|_ptsz)?\)", typedefs_text):
        base, ver, fl = m.group(1), int(m.group(2)), (m.group(3) or "")[1:]
        pfn.setdefault((base, fl), set()).add(ver)
    rows, problems = [], []
    for (base, fl), vers in sorted(pfn.items()):
        suffix = ("_" + fl) if fl else ""
        cands = []
        for s in symbols:
            if not s.startswith(base):
                continue
            if fl and not s.endswith(suffix):
                continue
            if not fl and (s.endswith("_ptds") or s.endswith("_ptsz")):
                continue
            o = variant_order(s, base)
            if o is not None:
                cands.append((o, s))
        cands.sort()
        vers = sorted(vers)
        if not cands:
            problems.append("%s%s: no exported symbol" % (base, suffix))
            continue
        # Newest versions map to the newest symbols; older versions that have
        # no symbol of their own (the driver dropped them) map to the oldest.
        syms = [s for _, s in cands]
        pad = len(vers) - len(syms)
        if pad < 0:
            syms = syms[-len(vers):]
        elif pad > 0:
            syms = [syms[0]] * pad + syms
        flav = {"": "CUSNAP_PROC_DEFAULT", "ptds": "CUSNAP_PROC_PTDS", "ptsz": "CUSNAP_PROC_PTSZ"}[fl]
        for v, s in zip(vers, syms):
            rows.append('CUSNAP_CU_PROC("%s", %d, %s, %s)' % (base, v, flav, s))
    return rows, problems

HEADER = "// Generated by scripts/gen-entry-points.py from CUDA %s headers. Do not edit.\n"

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuda-include", default=os.environ.get("CUDA_INCLUDE", "/usr/local/cuda/include"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "cudaapi"))
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    cuda_h = os.path.join(a.cuda_include, "cuda.h")
    decls, typedefs_text = {}, ""
    for header, typedefs_header in HEADERS:
        path = os.path.join(a.cuda_include, header)
        for defs in (["__CUDA_API_VERSION_INTERNAL"], ["CUDA_API_PER_THREAD_DEFAULT_STREAM"], []):
            for k, v in declarations(preprocess(path, a.cuda_include, defs)).items():
                decls.setdefault(k, v)
        tpath = os.path.join(a.cuda_include, typedefs_header)
        preprocess(tpath, a.cuda_include, ["__CUDA_API_VERSION_INTERNAL"])  # must compile
        typedefs_text += open(tpath).read() + "\n"
    ver = re.search(r"#define CUDA_VERSION (\d+)", open(cuda_h).read()).group(1)
    prows, problems = proc_rows(typedefs_text, set(decls))
    files = {
        "entry_points.inc": HEADER % ver + "// CUSNAP_CU_ENTRY(symbol, (parameters), (arguments))\n" + "\n".join(entry_rows(decls)) + "\n",
        "proc_table.inc": HEADER % ver + "// CUSNAP_CU_PROC(name, first CUDA version, stream flavour, symbol)\n" + "\n".join(prows) + "\n",
    }
    for p in problems:
        print("gen-entry-points: note: " + p, file=sys.stderr)
    bad = False
    for fn, text in files.items():
        path = os.path.join(a.out, fn)
        if a.check:
            cur = open(path).read() if os.path.exists(path) else None
            if cur != text:
                print("gen-entry-points: %s is out of date; run scripts/gen-entry-points.py" % path, file=sys.stderr)
                bad = True
        else:
            with open(path, "w") as f:
                f.write(text)
    if not a.check:
        print("gen-entry-points: %d entry points, %d resolver rows (CUDA %s)" % (len(decls), len(prows), ver))
    return 1 if bad else 0

sys.exit(main())
