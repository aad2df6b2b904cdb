// The emulated CUDA driver: state, devices and contexts, memory, launch checks and errors (see
// driver.h for what it is and checks; driver_streams.cpp queues the work).

#include "driver.h"

namespace emu_driver {

State& S() {
    static State* s = [] {
        State* st = new State;
        st->queues.push_back(std::make_shared<Queue>());  // the legacy stream's
        return st;
    }();
    return *s;
}

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

// Whether [p, p+n) lies inside one allocation of `d` (address -> bytes).
bool in_map(const std::map<CUdeviceptr, size_t>& d, CUdeviceptr p, size_t n) {
    auto it = d.upper_bound(p);
    if (it == d.begin()) return false;
    --it;
    size_t off = (size_t)(p - it->first);
    return off < it->second && n <= it->second - off;
}

// Whether [p, p+n) lies inside one live device allocation (an empty range always does).
bool in_device(CUdeviceptr p, size_t n) { return n == 0 || in_map(S().device, p, n); }

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

CUresult check_launch(const Func* f, const unsigned block[3], void** params) {
    if (!f->sizes.empty() && params == nullptr)
        return fail(CUDA_ERROR_INVALID_VALUE, "launching %s: no kernelParams for %zu parameters",
                    f->name.c_str(), f->sizes.size());
    unsigned threads = block[0] * block[1] * block[2];
    if (f->regs != 0 && !registers_fit(f->regs, threads))
        return fail(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
                    "launching %s: %u threads of %u registers each exceed the 64K registers of a "
                    "block",
                    f->name.c_str(), threads, f->regs);
    // A pointer argument into memory freed since (no live allocation holds it): on a GPU the
    // kernel would read or write whatever took the memory over, or fault.
    for (size_t i = 0; i < f->sizes.size(); i++) {
        if (f->sizes[i] != 8) continue;
        CUdeviceptr v;
        memcpy(&v, params[i], 8);
        if (!in_device(v, 1) && in_map(S().freed, v, 1))
            return fail(CUDA_ERROR_ILLEGAL_ADDRESS,
                        "launching %s: argument %zu (0x%llx) points into freed device memory",
                        f->name.c_str(), i, v);
    }
    return CUDA_SUCCESS;
}

CUresult execute(const Func* f, const unsigned grid[3], const unsigned block[3], void** params) {
    char err[2048] = {0};
    int rc = dsv4_emu_launch(f->name.c_str(), grid[0], grid[1], grid[2], block[0], block[1],
                             block[2], params, err, sizeof err);
    if (rc != 0) {
        S().sticky = CUDA_ERROR_LAUNCH_FAILED;
        return fail(CUDA_ERROR_LAUNCH_FAILED, "%s", err);
    }
    return check_guards(f->name.c_str());
}

std::vector<std::vector<unsigned char>> copy_args(const Func* f, void** params) {
    std::vector<std::vector<unsigned char>> args;
    for (size_t i = 0; i < f->sizes.size(); i++) {
        const unsigned char* a = (const unsigned char*)params[i];
        args.emplace_back(a, a + f->sizes[i]);
    }
    return args;
}

}  // namespace emu_driver

using namespace emu_driver;

// ---- initialization, devices, contexts ----

API CUresult cuInit(unsigned flags) {
    std::lock_guard<std::mutex> lock(S().mu);
    if (flags != 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuInit(%u): flags must be 0", flags);
    const char* schedule = getenv("DSV4_CUDA_EMU_SCHEDULE");
    if (schedule == nullptr || *schedule == 0 || strcmp(schedule, "deferred") == 0) {
        S().deferred = true;
    } else if (strcmp(schedule, "issue") == 0) {
        S().deferred = false;
    } else {
        return fail(CUDA_ERROR_INVALID_VALUE,
                    "cuInit: DSV4_CUDA_EMU_SCHEDULE=%s: expected `deferred` or `issue`", schedule);
    }
    S().initialized = true;
    return CUDA_SUCCESS;
}

API CUresult cuDriverGetVersion(int* v) {
    if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *v = 12080;
    return CUDA_SUCCESS;
}

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


// ---- memory ----

// Free memory: what the context's allocations leave of the device's.
API CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
    NEED_CTX("cuMemGetInfo");
    if (free == nullptr || total == nullptr) return fail(CUDA_ERROR_INVALID_VALUE, "cuMemGetInfo: null");
    *total = (size_t)kTotalMem;
    *free = (size_t)(kTotalMem - S().device_bytes);
    return CUDA_SUCCESS;
}

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
    // The new block may reuse freed memory: that is live again (freed ranges are disjoint).
    auto& fr = S().freed;
    const CUdeviceptr b0 = (CUdeviceptr)(uintptr_t)base, b1 = b0 + total;
    auto it = fr.upper_bound(b0);
    if (it != fr.begin() && std::prev(it)->first + std::prev(it)->second > b0)
        fr.erase(std::prev(it));
    for (it = fr.lower_bound(b0); it != fr.end() && it->first < b1;) it = fr.erase(it);
    return CUDA_SUCCESS;
}

API CUresult cuMemFree_v2(CUdeviceptr ptr) {
    NEED_CTX("cuMemFree");
    auto it = S().device.find(ptr);
    if (it == S().device.end())
        return fail(CUDA_ERROR_INVALID_VALUE, "cuMemFree(0x%llx): not an allocation", ptr);
    // A GPU's cuMemFree waits for the device's work first.
    if (CUresult rc = drain_all()) return rc;
    S().device_bytes -= it->second;
    S().freed[ptr] = it->second;
    if (S().freed.size() > 65536) S().freed.erase(S().freed.begin());
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
    if (S().host.count((CUdeviceptr)(uintptr_t)p) == 0)
        return fail(CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost(%p): not a page-locked allocation", p);
    // Queued copies may still read or write it: they run first.
    if (CUresult rc = drain_all()) return rc;
    if (S().host.erase((CUdeviceptr)(uintptr_t)p) == 0)
        return fail(CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost(%p): not a page-locked allocation", p);
    free(p);
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

