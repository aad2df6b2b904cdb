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
// Work is asynchronous, as on a GPU (driver_streams.cpp): launches, memsets, copies and graph
// launches wait in their stream's queue until something needs them, and then run as late and
// in as adversarial an order as CUDA's ordering rules allow. The legacy stream and non-blocking
// streams do not order each other; copies from page-locked memory read it when they run, copies
// into it write it then. DSV4_CUDA_EMU_SCHEDULE=issue runs each piece of work when it is issued
// instead (one valid schedule), to tell a missing synchronisation from a wrong kernel.
//
// This header is what the driver's files share: the handle types, the driver's state, the checks
// every entry point makes, and the launch itself. driver.cpp has the state, devices, contexts,
// memory, launches and errors; driver_streams.cpp the queues, streams, events and asynchronous
// copies; driver_modules.cpp the kernel images (reading CUBINs) and functions; driver_graphs.cpp
// the graphs.

#pragma once

// The build puts emu/shim.h (the kernels' CUDA dialect) in front of every file; the driver uses
// none of it, and its __noinline__ would break the standard library's own uses of that name.
#undef __noinline__

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
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
// One piece of queued work: what it does when it runs, and its place in the issue order of all
// streams.
struct Work {
    unsigned long long order;
    std::function<CUresult()> run;
};
// A stream's work: what waits to run, how much was issued and how much has run. Events and
// waits hold the queue itself, so it outlives a destroyed stream until its work has run.
struct Queue {
    std::deque<Work> pending;
    unsigned long long issued = 0, done = 0;
    // Orders work with the legacy stream (created without CU_STREAM_NON_BLOCKING).
    bool blocking = false;
    // The stream was destroyed: the queue goes once its work has run.
    bool orphan = false;
};
struct Stream {
    unsigned flags;
    std::shared_ptr<Queue> q;
};
struct Event {
    // The stream of the last record (none before the first) and how much of its work the
    // record follows.
    std::shared_ptr<Queue> q;
    unsigned long long at;
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
    // Shared with queued launches of the graph, which may run after cuGraphExecDestroy.
    std::shared_ptr<const std::vector<Node>> nodes;
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
    // The legacy stream's queue, then every created stream's, in creation order.
    std::vector<std::shared_ptr<Queue>> queues;
    // Whether work waits in its queue (else it runs as it is issued: DSV4_CUDA_EMU_SCHEDULE).
    bool deferred = true;
    unsigned long long issued = 0;  // work issued on every stream so far
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
// Whether [p, p+n) lies inside one allocation of `d` (address -> bytes).
bool in_map(const std::map<CUdeviceptr, size_t>& d, CUdeviceptr p, size_t n);
// Whether [p, p+n) lies inside one live device allocation (an empty range always does).
bool in_device(CUdeviceptr p, size_t n);
// What a GPU checks when `f` is launched on grid x block with cuLaunchKernel-style `params`.
CUresult check_launch(const Func* f, const unsigned block[3], void** params);
// Run `f` (a launch that passed check_launch) now; a fault is sticky.
CUresult execute(const Func* f, const unsigned grid[3], const unsigned block[3], void** params);
// The argument values of a launch of `f`, copied (the driver copies them at the call).
std::vector<std::vector<unsigned char>> copy_args(const Func* f, void** params);

// The queues (driver_streams.cpp); the caller holds the state's lock.
// Queue `run` on stream `st` (which stream_ok accepted), after the stream's earlier work.
CUresult enqueue(void* st, std::function<CUresult()> run);
// Run stream `st`'s queued work, and what it waits for; the first fault, if any.
CUresult drain_stream(void* st);
// Run all queued work, newest runnable first; the first fault, if any.
CUresult drain_all();

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
