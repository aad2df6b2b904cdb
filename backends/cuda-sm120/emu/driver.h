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
//
// This header is what the driver's files share: the handle types, the driver's state, the checks
// every entry point makes, and the launch itself. driver.cpp has the state, devices, contexts,
// memory, launches, streams, events and errors; driver_modules.cpp the kernel images (reading
// CUBINs) and functions; driver_graphs.cpp the graphs.

#pragma once

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

namespace emu_driver {

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
    std::map<CUdeviceptr, size_t> freed;  // recently freed allocations, not yet reused
    unsigned long long device_bytes = 0;
    CUresult sticky = CUDA_SUCCESS;
    unsigned long failures = 0;
    std::string messages;  // one line per failed call (the first 64 KiB)
};

// The driver's state (never destroyed: calls may still come while the process exits).
State& S();
// The context this thread made current (only the primary context exists).
extern thread_local const void* t_current;

// Count and print a failed call; returns `rc`.
CUresult fail(CUresult rc, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// Whether the driver is initialized, no kernel has faulted, and `fn`'s thread has a context.
CUresult need_ctx(const char* fn);
// Whether `st` names the legacy stream or a live created stream.
bool stream_ok(void* st);
// Run `f` on grid x block with cuLaunchKernel-style `params`, after the launch checks.
CUresult run(const Func* f, const unsigned grid[3], const unsigned block[3], void** params);

}  // namespace emu_driver

#define NEED_CTX(fn)                                 \
    std::lock_guard<std::mutex> lock_(S().mu);       \
    if (CUresult rc_ = need_ctx(fn)) return rc_
#define NEED_STREAM(fn, st) \
    if (!stream_ok(st))     \
        return fail(CUDA_ERROR_INVALID_HANDLE, "%s: stream %p is not a live stream", fn, st)

#define NEED_INIT(fn)                           \
    std::lock_guard<std::mutex> lock_(S().mu);  \
    if (!S().initialized) return fail(CUDA_ERROR_NOT_INITIALIZED, "%s before cuInit", fn)
#define NEED_DEV(fn, d) \
    if ((d) != 0) return fail(CUDA_ERROR_INVALID_DEVICE, "%s: device %d does not exist", fn, d)
