# What a POSIX-fd export of the real driver is: readlink and (dev, ino) of two exports of one
# allocation, against the process's other descriptors (the driver's own). Run on the GPU machine:
#   python3 tests/gpu/probes/export_fd.py
# Result on the H200 (580.159.04): docs/gpu-runs/gpu-test-shim-and-watch-h200.log (each export an open
# of /dev/nvidiactl, the same device and inode as the driver's own control descriptor).
import ctypes, os
cu = ctypes.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0: raise SystemExit(f"{what}: {r}")
ck(cu.cuInit(0), "cuInit")
dev = ctypes.c_int(); ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
ck(cu.cuCtxSetCurrent(ctx), "setcurrent")
class Loc(ctypes.Structure): _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
class Flags(ctypes.Structure): _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]
class Prop(ctypes.Structure): _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Loc), ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", Flags)]
p = Prop(); p.type = 1; p.requestedHandleTypes = 1; p.location.type = 1; p.location.id = 0
gran = ctypes.c_size_t(); ck(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(p), 0), "gran")
h = ctypes.c_ulonglong(); ck(cu.cuMemCreate(ctypes.byref(h), gran, ctypes.byref(p), ctypes.c_ulonglong(0)), "create")
fds = []
for i in range(2):
    fd = ctypes.c_int(-1); ck(cu.cuMemExportToShareableHandle(ctypes.byref(fd), h, 1, ctypes.c_ulonglong(0)), "export"); fds.append(fd.value)
def show(fd):
    st = os.fstat(fd)
    return f"fd {fd}: {os.readlink(f'/proc/self/fd/{fd}')} dev={st.st_dev} ino={st.st_ino} mode={oct(st.st_mode)} rdev={st.st_rdev}"
print("exports:"); [print("  " + show(f)) for f in fds]
print("the process's other descriptors:")
for n in sorted(int(x) for x in os.listdir("/proc/self/fd")):
    if n in fds: continue
    try: print("  " + show(n))
    except OSError as e: print(f"  fd {n}: {e}")
