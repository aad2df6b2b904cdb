// The CUDA driver API on the CPU emulator: a stand-in libcuda.so that lets the cuda-sm120 device
// (src/cuda.rs, through cudarc) run without a GPU. src/emu/build.rs (Library::Driver) builds it
// with the kernels and emu/runtime.cpp; cuda.rs loads it when DSV4_CUDA_DRIVER=emu. The kernel
// image cuModuleLoadData gets is NVRTC's real CUBIN (or PTX): it is checked to be a CUDA ELF
// (or PTX) naming every function asked for, and launches run the same kernels built for the CPU.
//
// It checks what a GPU's driver checks, and somewhat more: cuInit first; a current context on the
// calling thread for every call that needs one; handles that exist and are not destroyed; copies
// and memsets inside one live allocation; no dynamic shared memory or `extra` launch arguments;
// a block's registers (ptxas's count per kernel, read from the CUBIN) within the 64K CUDA has;
// graph nodes depending only on nodes of their own graph; writes outside a buffer (guard bytes,
// checked after every kernel). A kernel fault is sticky, as on a GPU: every later call returns
// it. Every failed call is counted and printed to stderr as "dsv4 emulated driver: ...";
// dsv4_emu_driver_failures() returns the count and the messages.
//
// What it does not model is asynchrony: each call's work is done before the call returns, in
// issue order (one valid schedule of a GPU's). Queued streams and missing events are what the
// cuda-emu device (src/emu/streams.rs) exercises.

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#ifndef DSV4_DRIVER_CC_MAJOR
#error "build with -DDSV4_DRIVER_CC_MAJOR=N -DDSV4_DRIVER_CC_MINOR=M"
#endif

extern "C" int dsv4_emu_launch(const char* name, unsigned gx, unsigned gy, unsigned gz,
                               unsigned bx, unsigned by, unsigned bz, void** params, char* err,
                               size_t errlen);
extern "C" int dsv4_emu_params(const char* name, size_t* sizes, int cap);

#define API extern "C" __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum : int {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_LAUNCH_FAILED = 719,
};

namespace {

// The 12.x layout of CUDA_KERNEL_NODE_PARAMS (the _v2 entry points take it).
struct KernelNodeParams {
    void* func;
    unsigned grid[3];
    unsigned block[3];
    unsigned shared_mem_bytes;
    void** kernel_params;
    void** extra;
    void* kern;
    void* ctx;
};

struct Module {
    std::vector<unsigned char> image;
    bool elf;
    // Registers per thread of each kernel of a CUBIN (what ptxas allocated).
    std::map<std::string, unsigned> regs;
};
struct Func {
    std::string name;
    std::vector<size_t> sizes;
    Module* module;
    unsigned regs;  // 0 when unknown (a PTX image: the driver's JIT allocates them)
};
struct Stream {
    unsigned flags;
};
struct Event {
    bool recorded;
};
// A kernel node, or one launch of an instantiated graph: the argument values are copies.
struct Node {
    void* graph;
    Func* func;
    unsigned grid[3], block[3];
    std::vector<std::vector<unsigned char>> args;
};
struct Graph {
    std::vector<Node*> nodes;
};
struct Exec {
    std::vector<Node> nodes;
};

constexpr size_t kAlign = 256;
constexpr size_t kGuard = 256;
constexpr unsigned char kGuardByte = 0xA5;
constexpr unsigned long long kTotalMem = 8ull << 30;
constexpr int kPrimaryCtx = 0x51c7;
const char* const kName = "dsv4 emulated driver (cuda-emu kernels on the CPU)";

struct State {
    std::mutex mu;
    bool initialized = false;
    int ctx_refs = 0;
    std::set<void*> modules, funcs, streams, events, graphs, nodes, execs;
    std::map<CUdeviceptr, size_t> device;  // address -> bytes, between two guards
    std::map<CUdeviceptr, size_t> host;
    unsigned long long device_bytes = 0;
    CUresult sticky = CUDA_SUCCESS;
    unsigned long failures = 0;
    std::string messages;  // one line per failed call (the first 64 KiB)
};

// Never destroyed: calls may still come while the process exits.
State& S() {
    static State* s = new State;
    return *s;
}

// The context this thread made current (only the primary context exists).
thread_local const void* t_current = nullptr;

CUresult fail(CUresult rc, const char* fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    S().failures++;
    if (S().messages.size() < 65536) S().messages += std::string(buf) + "\n";
    fprintf(stderr, "dsv4 emulated driver: %s\n", buf);
    return rc;
}

// Whether the driver is initialized, no kernel has faulted, and `fn`'s thread has a context.
CUresult need_ctx(const char* fn) {
    State& s = S();
    if (!s.initialized) return fail(CUDA_ERROR_NOT_INITIALIZED, "%s before cuInit", fn);
    if (s.sticky != CUDA_SUCCESS) return s.sticky;
    if (t_current == nullptr || s.ctx_refs == 0)
        return fail(CUDA_ERROR_INVALID_CONTEXT, "%s without a current context on this thread", fn);
    return CUDA_SUCCESS;
}

bool stream_ok(void* st) {
    // null is the legacy stream; 1 and 2 are CU_STREAM_LEGACY and CU_STREAM_PER_THREAD.
    return st == nullptr || st == (void*)1 || st == (void*)2 || S().streams.count(st) != 0;
}

#define NEED_CTX(fn)                                 \
    std::lock_guard<std::mutex> lock_(S().mu);       \
    if (CUresult rc_ = need_ctx(fn)) return rc_
#define NEED_STREAM(fn, st) \
    if (!stream_ok(st))     \
        return fail(CUDA_ERROR_INVALID_HANDLE, "%s: stream %p is not a live stream", fn, st)

// Whether [p, p+n) lies inside one live device allocation (an empty range always does).
bool in_device(CUdeviceptr p, size_t n) {
    if (n == 0) return true;
    const auto& d = S().device;
    auto it = d.upper_bound(p);
    if (it == d.begin()) return false;
    --it;
    size_t off = (size_t)(p - it->first);
    return off < it->second && n <= it->second - off;
}

// After `kernel` ran: every guard intact, else an illegal-address fault (guards restored).
CUresult check_guards(const char* kernel) {
    State& s = S();
    for (const auto& a : s.device) {
        unsigned char* base = (unsigned char*)(uintptr_t)a.first;
        for (int side = 0; side < 2; side++) {
            unsigned char* g = side == 0 ? base - kGuard : base + a.second;
            for (size_t i = 0; i < kGuard; i++) {
                if (g[i] == kGuardByte) continue;
                long long off = side == 0 ? -(long long)(kGuard - i) : (long long)(a.second + i);
                memset(g, kGuardByte, kGuard);
                s.sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
                return fail(CUDA_ERROR_ILLEGAL_ADDRESS,
                            "kernel %s wrote outside the allocation at 0x%llx (%zu bytes), at "
                            "offset %lld",
                            kernel, a.first, a.second, off);
            }
        }
    }
    return CUDA_SUCCESS;
}

// CUDA's check at launch: registers are allocated per warp in units of 256, and a block may
// use at most 64K of them (sm_80 through sm_120).
bool registers_fit(unsigned regs, unsigned threads) {
    unsigned long long per_warp = ((unsigned long long)regs * 32 + 255) / 256 * 256;
    return per_warp * ((threads + 31) / 32) <= 65536;
}

CUresult run(const Func* f, const unsigned grid[3], const unsigned block[3], void** params) {
    if (!f->sizes.empty() && params == nullptr)
        return fail(CUDA_ERROR_INVALID_VALUE, "launching %s: no kernelParams for %zu parameters",
                    f->name.c_str(), f->sizes.size());
    unsigned threads = block[0] * block[1] * block[2];
    if (f->regs != 0 && !registers_fit(f->regs, threads))
        return fail(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
                    "launching %s: %u threads of %u registers each exceed the 64K registers of a "
                    "block",
                    f->name.c_str(), threads, f->regs);
    char err[2048] = {0};
    int rc = dsv4_emu_launch(f->name.c_str(), grid[0], grid[1], grid[2], block[0], block[1],
                             block[2], params, err, sizeof err);
    if (rc != 0) {
        S().sticky = CUDA_ERROR_LAUNCH_FAILED;
        return fail(CUDA_ERROR_LAUNCH_FAILED, "%s", err);
    }
    return check_guards(f->name.c_str());
}

uint64_t rd(const unsigned char* p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

// The size of a 64-bit little-endian ELF image for a CUDA device (EM_CUDA), 0 when it is not one.
size_t cuda_elf_size(const unsigned char* p) {
    if (p[4] != 2 || p[5] != 1 || rd(p + 0x12, 2) != 190) return 0;
    uint64_t phoff = rd(p + 0x20, 8), shoff = rd(p + 0x28, 8);
    uint64_t phent = rd(p + 0x36, 2), phnum = rd(p + 0x38, 2);
    uint64_t shent = rd(p + 0x3A, 2), shnum = rd(p + 0x3C, 2);
    uint64_t end = 64;
    if (phoff + phent * phnum > end) end = phoff + phent * phnum;
    if (shoff + shent * shnum > end) end = shoff + shent * shnum;
    for (uint64_t i = 0; i < shnum; i++) {
        const unsigned char* sh = p + shoff + i * shent;
        if (rd(sh + 4, 4) == 8) continue;  // SHT_NOBITS occupies no file bytes
        uint64_t e = rd(sh + 0x18, 8) + rd(sh + 0x20, 8);
        if (e > end) end = e;
    }
    return (size_t)end;
}

// The register count of every kernel of a CUBIN, from the EIATTR_REGCOUNT (0x2f) attributes
// of its .nv.info sections: (symbol index, registers), the symbol named in the symbol table.
// Attributes are (format, attribute, 2 bytes) with `size` more bytes for format 4 (EIFMT_SVAL).
std::map<std::string, unsigned> cubin_regcounts(const std::vector<unsigned char>& img) {
    std::map<std::string, unsigned> regs;
    const unsigned char* p = img.data();
    uint64_t shoff = rd(p + 0x28, 8), shent = rd(p + 0x3A, 2), shnum = rd(p + 0x3C, 2);
    uint64_t shstrndx = rd(p + 0x3E, 2);
    auto sec = [&](uint64_t i) { return p + shoff + i * shent; };
    auto str = [&](uint64_t strsec, uint64_t off) -> std::string {
        uint64_t o = rd(sec(strsec) + 0x18, 8) + off;
        if (o >= img.size()) return std::string();
        return std::string((const char*)p + o, strnlen((const char*)p + o, img.size() - o));
    };
    const unsigned char* symtab = nullptr;
    for (uint64_t i = 0; i < shnum; i++)
        if (rd(sec(i) + 4, 4) == 2) symtab = sec(i);  // SHT_SYMTAB
    if (symtab == nullptr) return regs;
    uint64_t symoff = rd(symtab + 0x18, 8), symsize = rd(symtab + 0x20, 8);
    uint64_t symstr = rd(symtab + 0x28, 4);
    for (uint64_t i = 0; i < shnum; i++) {
        if (str(shstrndx, rd(sec(i), 4)).rfind(".nv.info", 0) != 0) continue;
        uint64_t off = rd(sec(i) + 0x18, 8), end = off + rd(sec(i) + 0x20, 8);
        while (off + 4 <= end && end <= img.size()) {
            unsigned fmt = p[off], attr = p[off + 1];
            uint64_t size = fmt == 4 ? rd(p + off + 2, 2) : 0;
            if (fmt == 4 && attr == 0x2f && size >= 8) {
                uint64_t sym = rd(p + off + 4, 4), val = rd(p + off + 8, 4);
                if ((sym + 1) * 24 <= symsize)
                    regs[str(symstr, rd(p + symoff + sym * 24, 4))] = (unsigned)val;
            }
            off += 4 + size;
        }
    }
    return regs;
}

bool image_names(const Module* m, const char* name) {
    std::string needle = m->elf ? std::string(1, '\0') + name + std::string(1, '\0')
                                : std::string(".entry ") + name + "(";
    const unsigned char* b = m->image.data();
    return std::search(b, b + m->image.size(), needle.begin(), needle.end()) !=
           b + m->image.size();
}

}  // namespace

// ---- initialization, devices, contexts ----

API CUresult cuInit(unsigned flags) {
    std::lock_guard<std::mutex> lock(S().mu);
    if (flags != 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuInit(%u): flags must be 0", flags);
    S().initialized = true;
    return CUDA_SUCCESS;
}

API CUresult cuDriverGetVersion(int* v) {
    if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *v = 12080;
    return CUDA_SUCCESS;
}

#define NEED_INIT(fn)                           \
    std::lock_guard<std::mutex> lock_(S().mu);  \
    if (!S().initialized) return fail(CUDA_ERROR_NOT_INITIALIZED, "%s before cuInit", fn)
#define NEED_DEV(fn, d) \
    if ((d) != 0) return fail(CUDA_ERROR_INVALID_DEVICE, "%s: device %d does not exist", fn, d)

API CUresult cuDeviceGetCount(int* n) {
    NEED_INIT("cuDeviceGetCount");
    *n = 1;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice* d, int ordinal) {
    NEED_INIT("cuDeviceGet");
    NEED_DEV("cuDeviceGet", ordinal);
    *d = 0;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
    NEED_INIT("cuDeviceGetName");
    NEED_DEV("cuDeviceGetName", d);
    if (name == nullptr || len <= 0) return fail(CUDA_ERROR_INVALID_VALUE,
                                                 "cuDeviceGetName: no buffer");
    snprintf(name, (size_t)len, "%s", kName);
    return CUDA_SUCCESS;
}

API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
    NEED_INIT("cuDeviceTotalMem");
    NEED_DEV("cuDeviceTotalMem", d);
    *bytes = (size_t)kTotalMem;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice d) {
    NEED_INIT("cuDeviceGetAttribute");
    NEED_DEV("cuDeviceGetAttribute", d);
    switch (attr) {
        case 75: *v = DSV4_DRIVER_CC_MAJOR; return CUDA_SUCCESS;
        case 76: *v = DSV4_DRIVER_CC_MINOR; return CUDA_SUCCESS;
        case 16: *v = 1; return CUDA_SUCCESS;  // multiprocessors
        default: return fail(CUDA_ERROR_INVALID_VALUE,
                             "cuDeviceGetAttribute(%d) is not emulated", attr);
    }
}

API CUresult cuDevicePrimaryCtxRetain(void** ctx, CUdevice d) {
    NEED_INIT("cuDevicePrimaryCtxRetain");
    NEED_DEV("cuDevicePrimaryCtxRetain", d);
    S().ctx_refs++;
    *ctx = (void*)&kPrimaryCtx;
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    NEED_INIT("cuDevicePrimaryCtxRelease");
    NEED_DEV("cuDevicePrimaryCtxRelease", d);
    if (S().ctx_refs == 0)
        return fail(CUDA_ERROR_INVALID_CONTEXT, "cuDevicePrimaryCtxRelease: not retained");
    S().ctx_refs--;
    return CUDA_SUCCESS;
}

API CUresult cuCtxSetCurrent(void* ctx) {
    NEED_INIT("cuCtxSetCurrent");
    if (ctx != nullptr && (ctx != (void*)&kPrimaryCtx || S().ctx_refs == 0))
        return fail(CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent(%p): not a live context", ctx);
    t_current = ctx;
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetCurrent(void** ctx) {
    NEED_INIT("cuCtxGetCurrent");
    *ctx = (void*)t_current;
    return CUDA_SUCCESS;
}

API CUresult cuCtxSynchronize(void) {
    NEED_CTX("cuCtxSynchronize");
    return CUDA_SUCCESS;
}

// ---- modules and functions ----

API CUresult cuModuleLoadData(void** module, const void* image) {
    NEED_CTX("cuModuleLoadData");
    const unsigned char* p = (const unsigned char*)image;
    if (p == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuModuleLoadData: no image");
    Module* m = new Module;
    if (memcmp(p, "\x7f" "ELF", 4) == 0) {
        size_t n = cuda_elf_size(p);
        if (n == 0) {
            delete m;
            return fail(CUDA_ERROR_INVALID_IMAGE,
                        "cuModuleLoadData: an ELF image, but not a 64-bit CUDA one");
        }
        m->image.assign(p, p + n);
        m->elf = true;
        m->regs = cubin_regcounts(m->image);
    } else {
        size_t n = strlen((const char*)p);
        m->image.assign(p, p + n);
        m->elf = false;
        std::string text((const char*)p, n);
        if (text.find(".version") == std::string::npos ||
            text.find(".target sm_") == std::string::npos) {
            delete m;
            return fail(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData: neither a CUBIN nor PTX");
        }
    }
    S().modules.insert(m);
    *module = m;
    return CUDA_SUCCESS;
}

API CUresult cuModuleGetFunction(void** func, void* module, const char* name) {
    NEED_CTX("cuModuleGetFunction");
    if (S().modules.count(module) == 0)
        return fail(CUDA_ERROR_INVALID_HANDLE,
                    "cuModuleGetFunction(%s): not a loaded module", name);
    Module* m = (Module*)module;
    if (!image_names(m, name))
        return fail(CUDA_ERROR_NOT_FOUND, "cuModuleGetFunction(%s): the %s does not name it", name,
                    m->elf ? "CUBIN" : "PTX");
    size_t sizes[64];
    int n = dsv4_emu_params(name, sizes, 64);
    if (n < 0 || n > 64)
        return fail(CUDA_ERROR_NOT_FOUND,
                    "cuModuleGetFunction(%s): the emulator has no such kernel", name);
    unsigned regs = 0;
    if (m->elf) {
        auto r = m->regs.find(name);
        if (r == m->regs.end())
            return fail(CUDA_ERROR_INVALID_IMAGE,
                        "cuModuleGetFunction(%s): the CUBIN has no register count for it", name);
        regs = r->second;
    }
    Func* f = new Func{name, std::vector<size_t>(sizes, sizes + n), m, regs};
    S().funcs.insert(f);
    *func = f;
    return CUDA_SUCCESS;
}

API CUresult cuModuleUnload(void* module) {
    NEED_CTX("cuModuleUnload");
    if (S().modules.erase(module) == 0)
        return fail(CUDA_ERROR_INVALID_HANDLE, "cuModuleUnload(%p): not a loaded module", module);
    for (auto it = S().funcs.begin(); it != S().funcs.end();) {
        if (((Func*)*it)->module == module) {
            delete (Func*)*it;
            it = S().funcs.erase(it);
        } else {
            ++it;
        }
    }
    delete (Module*)module;
    return CUDA_SUCCESS;
}

// ---- memory ----

API CUresult cuMemAlloc_v2(CUdeviceptr* ptr, size_t bytes) {
    NEED_CTX("cuMemAlloc");
    if (bytes == 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc(0)");
    if (bytes > kTotalMem - S().device_bytes) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t total = (bytes + 2 * kGuard + kAlign - 1) / kAlign * kAlign;
    unsigned char* base = (unsigned char*)aligned_alloc(kAlign, total);
    if (base == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    // A fresh allocation holds garbage on a GPU too: never zeros here.
    memset(base, 0xCD, total);
    memset(base, kGuardByte, kGuard);
    memset(base + kGuard + bytes, kGuardByte, kGuard);
    *ptr = (CUdeviceptr)(uintptr_t)(base + kGuard);
    S().device[*ptr] = bytes;
    S().device_bytes += bytes;
    return CUDA_SUCCESS;
}

API CUresult cuMemFree_v2(CUdeviceptr ptr) {
    NEED_CTX("cuMemFree");
    auto it = S().device.find(ptr);
    if (it == S().device.end())
        return fail(CUDA_ERROR_INVALID_VALUE, "cuMemFree(0x%llx): not an allocation", ptr);
    S().device_bytes -= it->second;
    S().device.erase(it);
    free((unsigned char*)(uintptr_t)ptr - kGuard);
    return CUDA_SUCCESS;
}

API CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned flags) {
    NEED_CTX("cuMemHostAlloc");
    if (bytes == 0 || flags > 7) return fail(CUDA_ERROR_INVALID_VALUE,
                                             "cuMemHostAlloc(%zu, %u)", bytes, flags);
    void* h = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (h == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    S().host[(CUdeviceptr)(uintptr_t)h] = bytes;
    *p = h;
    return CUDA_SUCCESS;
}

API CUresult cuMemFreeHost(void* p) {
    NEED_CTX("cuMemFreeHost");
    if (S().host.erase((CUdeviceptr)(uintptr_t)p) == 0)
        return fail(CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost(%p): not a page-locked allocation", p);
    free(p);
    return CUDA_SUCCESS;
}

API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, void* stream) {
    NEED_CTX("cuMemsetD8Async");
    NEED_STREAM("cuMemsetD8Async", stream);
    if (!in_device(dst, n))
        return fail(CUDA_ERROR_INVALID_VALUE,
                    "cuMemsetD8Async(0x%llx, %zu): outside every allocation", dst, n);
    if (n) memset((void*)(uintptr_t)dst, v, n);
    return CUDA_SUCCESS;
}

API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, void* stream) {
    NEED_CTX("cuMemcpyHtoDAsync");
    NEED_STREAM("cuMemcpyHtoDAsync", stream);
    if (!in_device(dst, n))
        return fail(CUDA_ERROR_INVALID_VALUE,
                    "cuMemcpyHtoDAsync(0x%llx, %zu): outside every allocation", dst, n);
    if (n) memcpy((void*)(uintptr_t)dst, src, n);
    return CUDA_SUCCESS;
}

API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, void* stream) {
    NEED_CTX("cuMemcpyDtoHAsync");
    NEED_STREAM("cuMemcpyDtoHAsync", stream);
    if (!in_device(src, n))
        return fail(CUDA_ERROR_INVALID_VALUE,
                    "cuMemcpyDtoHAsync(0x%llx, %zu): outside every allocation", src, n);
    if (n) memcpy(dst, (const void*)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

// ---- launches, streams, events ----

API CUresult cuLaunchKernel(void* func, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned shared, void* stream,
                            void** params, void** extra) {
    NEED_CTX("cuLaunchKernel");
    NEED_STREAM("cuLaunchKernel", stream);
    if (S().funcs.count(func) == 0)
        return fail(CUDA_ERROR_INVALID_HANDLE, "cuLaunchKernel(%p): not a function", func);
    const Func* f = (const Func*)func;
    if (shared != 0 || extra != nullptr)
        return fail(CUDA_ERROR_INVALID_VALUE,
                    "launching %s: dynamic shared memory (%u) or extra arguments",
                    f->name.c_str(), shared);
    const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    return run(f, grid, block, params);
}

API CUresult cuStreamCreate(void** stream, unsigned flags) {
    NEED_CTX("cuStreamCreate");
    if (flags > 1) return fail(CUDA_ERROR_INVALID_VALUE, "cuStreamCreate: flags %u", flags);
    Stream* s = new Stream{flags};
    S().streams.insert(s);
    *stream = s;
    return CUDA_SUCCESS;
}

API CUresult cuStreamDestroy_v2(void* stream) {
    NEED_CTX("cuStreamDestroy");
    if (S().streams.erase(stream) == 0)
        return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy(%p): not a created stream", stream);
    delete (Stream*)stream;
    return CUDA_SUCCESS;
}

API CUresult cuStreamSynchronize(void* stream) {
    NEED_CTX("cuStreamSynchronize");
    NEED_STREAM("cuStreamSynchronize", stream);
    return CUDA_SUCCESS;
}

API CUresult cuEventCreate(void** event, unsigned flags) {
    NEED_CTX("cuEventCreate");
    if (flags > 0xf) return fail(CUDA_ERROR_INVALID_VALUE, "cuEventCreate: flags %u", flags);
    Event* e = new Event{false};
    S().events.insert(e);
    *event = e;
    return CUDA_SUCCESS;
}

API CUresult cuEventDestroy_v2(void* event) {
    NEED_CTX("cuEventDestroy");
    if (S().events.erase(event) == 0)
        return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventDestroy(%p): not an event", event);
    delete (Event*)event;
    return CUDA_SUCCESS;
}

API CUresult cuEventRecord(void* event, void* stream) {
    NEED_CTX("cuEventRecord");
    NEED_STREAM("cuEventRecord", stream);
    if (S().events.count(event) == 0)
        return fail(CUDA_ERROR_INVALID_HANDLE, "cuEventRecord(%p): not an event", event);
    ((Event*)event)->recorded = true;
    return CUDA_SUCCESS;
}

API CUresult cuStreamWaitEvent(void* stream, void* event, unsigned flags) {
    NEED_CTX("cuStreamWaitEvent");
    NEED_STREAM("cuStreamWaitEvent", stream);
    if (S().events.count(event) == 0)
        return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamWaitEvent(%p): not an event", event);
    if (flags != 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuStreamWaitEvent: flags %u", flags);
    return CUDA_SUCCESS;
}

// ---- graphs ----

API CUresult cuGraphCreate(void** graph, unsigned flags) {
    NEED_CTX("cuGraphCreate");
    if (flags != 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuGraphCreate: flags must be 0");
    Graph* g = new Graph;
    S().graphs.insert(g);
    *graph = g;
    return CUDA_SUCCESS;
}

API CUresult cuGraphAddKernelNode_v2(void** node, void* graph, void* const* deps, size_t ndeps,
                                     const KernelNodeParams* p) {
    NEED_CTX("cuGraphAddKernelNode");
    if (S().graphs.count(graph) == 0)
        return fail(CUDA_ERROR_INVALID_HANDLE, "cuGraphAddKernelNode: %p is not a graph", graph);
    if (p == nullptr || S().funcs.count(p->func) == 0 || p->kern != nullptr)
        return fail(CUDA_ERROR_INVALID_VALUE,
                    "cuGraphAddKernelNode: no function in the parameters");
    const Func* f = (const Func*)p->func;
    if (p->shared_mem_bytes != 0 || p->extra != nullptr)
        return fail(CUDA_ERROR_INVALID_VALUE,
                    "cuGraphAddKernelNode(%s): dynamic shared memory or extra",
                    f->name.c_str());
    if (!f->sizes.empty() && p->kernel_params == nullptr)
        return fail(CUDA_ERROR_INVALID_VALUE,
                    "cuGraphAddKernelNode(%s): no kernelParams", f->name.c_str());
    for (size_t i = 0; i < ndeps; i++) {
        if (S().nodes.count(deps[i]) == 0 || ((Node*)deps[i])->graph != graph)
            return fail(CUDA_ERROR_INVALID_VALUE,
                        "cuGraphAddKernelNode(%s): dependency %zu is not a node of this graph",
                        f->name.c_str(), i);
    }
    Node* n = new Node{graph, (Func*)f, {p->grid[0], p->grid[1], p->grid[2]},
                       {p->block[0], p->block[1], p->block[2]}, {}};
    // The driver copies the argument values now: the caller may free them after this call.
    for (size_t i = 0; i < f->sizes.size(); i++) {
        const unsigned char* a = (const unsigned char*)p->kernel_params[i];
        n->args.emplace_back(a, a + f->sizes[i]);
    }
    S().nodes.insert(n);
    ((Graph*)graph)->nodes.push_back(n);
    *node = n;
    return CUDA_SUCCESS;
}

API CUresult cuGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long flags) {
    NEED_CTX("cuGraphInstantiateWithFlags");
    if (S().graphs.count(graph) == 0)
        return fail(CUDA_ERROR_INVALID_HANDLE, "cuGraphInstantiate: %p is not a graph", graph);
    if (flags != 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuGraphInstantiate: flags %llu", flags);
    // Nodes only depend on nodes added before them, so insertion order is a topological order.
    Exec* e = new Exec;
    for (const Node* n : ((Graph*)graph)->nodes) e->nodes.push_back(*n);
    S().execs.insert(e);
    *exec = e;
    return CUDA_SUCCESS;
}

API CUresult cuGraphLaunch(void* exec, void* stream) {
    NEED_CTX("cuGraphLaunch");
    NEED_STREAM("cuGraphLaunch", stream);
    if (S().execs.count(exec) == 0)
        return fail(CUDA_ERROR_INVALID_HANDLE,
                    "cuGraphLaunch: %p is not an executable graph", exec);
    for (Node& n : ((Exec*)exec)->nodes) {
        if (S().funcs.count(n.func) == 0)
            return fail(CUDA_ERROR_INVALID_HANDLE, "cuGraphLaunch: a node's module was unloaded");
        std::vector<void*> ptrs;
        for (auto& a : n.args) ptrs.push_back(a.data());
        if (CUresult rc = run(n.func, n.grid, n.block, ptrs.data())) return rc;
    }
    return CUDA_SUCCESS;
}

API CUresult cuGraphExecDestroy(void* exec) {
    NEED_CTX("cuGraphExecDestroy");
    if (S().execs.erase(exec) == 0)
        return fail(CUDA_ERROR_INVALID_HANDLE,
                    "cuGraphExecDestroy(%p): not an executable graph", exec);
    delete (Exec*)exec;
    return CUDA_SUCCESS;
}

API CUresult cuGraphDestroy(void* graph) {
    NEED_CTX("cuGraphDestroy");
    if (S().graphs.erase(graph) == 0)
        return fail(CUDA_ERROR_INVALID_HANDLE, "cuGraphDestroy(%p): not a graph", graph);
    for (Node* n : ((Graph*)graph)->nodes) {
        S().nodes.erase(n);
        delete n;
    }
    delete (Graph*)graph;
    return CUDA_SUCCESS;
}

// ---- errors ----

namespace {
const char* error_name(CUresult rc) {
    switch (rc) {
        case CUDA_SUCCESS: return "CUDA_SUCCESS";
        case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
        case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
        case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
        case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
        case CUDA_ERROR_INVALID_IMAGE: return "CUDA_ERROR_INVALID_IMAGE";
        case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
        case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
        case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
        case CUDA_ERROR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
        case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
        case CUDA_ERROR_LAUNCH_FAILED: return "CUDA_ERROR_LAUNCH_FAILED";
        default: return nullptr;
    }
}
}  // namespace

API CUresult cuGetErrorName(CUresult rc, const char** out) {
    *out = error_name(rc);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGetErrorString(CUresult rc, const char** out) {
    return cuGetErrorName(rc, out);
}

// The number of failed calls so far; their messages, one per line, into `out` (NUL-terminated,
// cut at `len`).
API unsigned long dsv4_emu_driver_failures(char* out, size_t len) {
    std::lock_guard<std::mutex> lock(S().mu);
    if (out != nullptr && len > 0) snprintf(out, len, "%s", S().messages.c_str());
    return S().failures;
}
