// The cuda-emu scheduler: runs a kernel launch on the CPU. Blocks run one after another; the
// threads of a block run as cooperative fibers in thread order, each until it finishes or waits at
// a barrier (__syncthreads: every thread of the block; __syncwarp, shuffles, votes: every lane of
// its warp). A barrier that can never complete (a thread exited, or threads wait at different
// barriers) is reported as an error instead of hanging. Launches are serialized by the caller
// (emu.rs holds a global mutex), so the globals below belong to the one running launch.
//
// Threads run in thread order and blocks in block order; -DDSV4_EMU_REVERSE (through
// DSV4_EMU_CXXFLAGS) runs both in reverse, so a kernel that reads another thread's shared/global
// writes without a barrier between them, or another block's global writes of the same launch
// (which no barrier orders on a GPU), gives different results under the two orders (a race a GPU
// may or may not show).
//
// Fibers switch with a minimal x86-64 context switch (callee-saved registers + rsp; no signal
// mask syscall); other architectures, or -DDSV4_EMU_UCONTEXT, use ucontext.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#if !defined(__x86_64__) && !defined(DSV4_EMU_UCONTEXT)
#define DSV4_EMU_UCONTEXT 1
#endif
#ifdef DSV4_EMU_UCONTEXT
#include <ucontext.h>
#endif

dsv4_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

const size_t kStack = 256 * 1024; // reserved per fiber; pages are committed on first touch
const unsigned kMaxThreads = 1024;

enum State { kReady, kWaitBlock, kWaitWarp, kDone };
enum WarpKind { kNone, kSyncwarp, kShuffle, kBallot };

// A stack and a saved context. A thread runs on a fiber from the free pool and gives it back when
// it finishes, so threads that never wait all run on the same (cache-hot) stack; a waiting thread
// keeps its fiber until it finishes.
struct Fiber {
    void* sp = nullptr; // saved stack pointer (asm switch)
#ifdef DSV4_EMU_UCONTEXT
    ucontext_t uc;
#endif
    char* stack = nullptr;
    unsigned index = 0;
    bool started = false; // has a live context (else (re)start it at its entry)
};

// One CUDA thread of the running block.
struct Thread {
    Fiber* fiber = nullptr;
    State state = kReady;
    dsv4_emu_dim3 tid{0, 0, 0};
    unsigned linear = 0;
    unsigned exchanges = 0; // warp exchanges (shuffles, votes) done: picks the slot buffer
};

struct Warp {
    unsigned size = 0, arrived = 0;
    WarpKind kind = kNone;
    // Exchange k uses slots[k & 1]: a lane can write buffer k & 1 again (exchange k + 2) only
    // after every lane passed exchange k + 1's barrier, i.e. after every lane read exchange k.
    // So one barrier per exchange suffices.
    uint64_t slots[2][32];
};

Fiber g_fibers[kMaxThreads];
unsigned g_pool = 0; // fibers with a stack
Fiber* g_free[kMaxThreads];
unsigned g_nfree = 0;
Thread g_threads[kMaxThreads];
Warp g_warps[kMaxThreads / 32];
void* g_sched_sp = nullptr;
#ifdef DSV4_EMU_UCONTEXT
ucontext_t g_sched_uc;
#endif
Thread* g_cur = nullptr;
unsigned g_nthreads = 0, g_block_arrived = 0;
unsigned g_pos = 0;  // the running thread's position in the pass (run_block)
unsigned g_live = 0; // threads of the block not finished
void (*g_body)(void*) = nullptr;
void* g_ctx = nullptr;
const char* g_name = "";
bool g_failed = false;
char g_err[1024];

void fail(const char* fmt, ...) {
    if (g_failed) return;
    g_failed = true;
    int n = snprintf(g_err, sizeof g_err, "kernel %s: ", g_name);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err + n, sizeof g_err - (size_t)n, fmt, ap);
    va_end(ap);
}

} // namespace

#ifndef DSV4_EMU_UCONTEXT
extern "C" __attribute__((visibility("hidden"))) void dsv4_emu_switch(void** save, void* load);
extern "C" __attribute__((visibility("hidden"))) void dsv4_emu_fiber_start();
__asm__(R"(
    .text
    .p2align 4
    .globl dsv4_emu_switch
    .hidden dsv4_emu_switch
    .type dsv4_emu_switch,@function
dsv4_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size dsv4_emu_switch, .-dsv4_emu_switch

    .p2align 4
    .globl dsv4_emu_fiber_start
    .hidden dsv4_emu_fiber_start
    .type dsv4_emu_fiber_start,@function
dsv4_emu_fiber_start:
    callq *%r12
    ud2
    .size dsv4_emu_fiber_start, .-dsv4_emu_fiber_start
)");
#endif

namespace {

// Save the running fiber `from` and resume `to` (nullptr: the scheduler).
inline void switch_fiber(Fiber* from, Fiber* to) {
#ifdef DSV4_EMU_UCONTEXT
    swapcontext(&from->uc, to ? &to->uc : &g_sched_uc);
#else
    dsv4_emu_switch(&from->sp, to ? to->sp : g_sched_sp);
#endif
}

// Switch from the running fiber back to the scheduler (which ends the pass).
inline void to_scheduler() { switch_fiber(g_cur->fiber, nullptr); }

// The thread at position `p` of a pass over the block.
inline Thread* at(unsigned p) {
#ifdef DSV4_EMU_REVERSE
    return &g_threads[g_nthreads - 1 - p];
#else
    return &g_threads[p];
#endif
}

// The first ready thread at pass position `from` or later, which becomes the running position;
// nullptr at the end of the pass.
Thread* next_ready(unsigned from) {
    for (unsigned p = from; p < g_nthreads; p++) {
        Thread* t = at(p);
        if (t->state == kReady) {
            g_pos = p;
            return t;
        }
    }
    return nullptr;
}

bool grow_pool(unsigned n);
void start_context(Fiber* f);

// Make `t` the running thread, giving it a fiber from the pool when it has none; false when
// no stack can be mapped (the launch has failed).
bool enter(Thread* t) {
    if (!t->fiber) {
        if (g_nfree == 0 && !grow_pool(g_pool + 1)) {
            fail("cannot map a fiber stack");
            return false;
        }
        t->fiber = g_free[--g_nfree];
        if (!t->fiber->started) start_context(t->fiber);
    }
    g_cur = t;
    threadIdx = t->tid;
    return true;
}

// The running thread waits (its state already says at what): hand the CPU straight to the next
// ready thread of the pass, or back to the scheduler at the pass's end. Returns when resumed.
// Handing over directly instead of through the scheduler halves the switches per barrier.
void wait_here() {
    Thread* me = g_cur;
    Thread* t = next_ready(g_pos + 1);
    if (t && !enter(t)) {
        g_cur = me;
        t = nullptr;
    }
    switch_fiber(me->fiber, t ? t->fiber : nullptr);
}

// A fiber's whole life: run the kernel body for whichever thread it is given; when it finishes,
// run the next thread of the pass on the same stack if that one has not started (a block
// without barriers runs all its threads without a switch), else give the fiber back and resume
// the next one (or the scheduler). A fiber resumed from the pool is given a thread.
void fiber_main() {
    for (;;) {
        g_body(g_ctx);
        Thread* me = g_cur;
        Fiber* f = me->fiber;
        me->state = kDone;
        me->fiber = nullptr;
        g_live--;
        Thread* t = next_ready(g_pos + 1);
        if (t && !t->fiber) {
            t->fiber = f;
            g_cur = t;
            threadIdx = t->tid;
            continue;
        }
        g_free[g_nfree++] = f;
        if (t) {
            g_cur = t;
            threadIdx = t->tid;
        }
        switch_fiber(f, t ? t->fiber : nullptr);
    }
}

void start_context(Fiber* f) {
#ifdef DSV4_EMU_UCONTEXT
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = kStack;
    f->uc.uc_link = nullptr;
    makecontext(&f->uc, fiber_main, 0);
#else
    // The frame dsv4_emu_switch pops: r15 r14 r13 r12 rbx rbp, then the return address. After
    // the ret, rsp must be 16-aligned for the call in dsv4_emu_fiber_start.
    // Stagger the stack tops by a few cache lines per fiber: tops a multiple of 4 KiB apart
    // would all map to the same cache sets and thrash L1 as the fibers take turns.
    uintptr_t color = (uintptr_t)(f->index % 61) * 64 + (uintptr_t)(f->index % 7) * 4096;
    uintptr_t top = ((uintptr_t)(f->stack + kStack) - color) & ~(uintptr_t)15;
    void** sp = (void**)(top - 72);
    for (int i = 0; i < 6; i++) sp[i] = nullptr;
    sp[3] = (void*)&fiber_main; // r12
    sp[6] = (void*)&dsv4_emu_fiber_start;
    f->sp = sp;
#endif
    f->started = true;
}

bool grow_pool(unsigned n) {
    while (g_pool < n) {
        void* s = mmap(nullptr, kStack + 4096, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (s == MAP_FAILED) return false;
        mprotect(s, 4096, PROT_NONE); // guard page below the stack
        g_fibers[g_pool].stack = (char*)s + 4096;
        g_fibers[g_pool].index = g_pool;
        g_fibers[g_pool].started = false;
        g_free[g_nfree++] = &g_fibers[g_pool];
        g_pool++;
    }
    return true;
}

const char* warp_kind_name(WarpKind k) {
    switch (k) {
    case kSyncwarp: return "__syncwarp";
    case kShuffle: return "a warp shuffle";
    case kBallot: return "a warp vote";
    default: return "a warp barrier";
    }
}

// Nothing can run: say why (exited threads at a barrier, or threads at different barriers).
void report_stuck() {
    const Thread *done = nullptr, *blk = nullptr, *warp = nullptr;
    for (unsigned i = 0; i < g_nthreads; i++) {
        const Thread* f = &g_threads[i];
        if (f->state == kDone && !done) done = f;
        if (f->state == kWaitBlock && !blk) blk = f;
        if (f->state == kWaitWarp && !warp) warp = f;
    }
    const dsv4_emu_dim3 b = blockIdx;
    if (blk && !warp && done) {
        fail("thread (%u,%u,%u) of block (%u,%u,%u) exited while others wait at __syncthreads",
             done->tid.x, done->tid.y, done->tid.z, b.x, b.y, b.z);
        return;
    }
    if (warp) {
        unsigned w = warp->linear / 32;
        for (unsigned i = w * 32; i < w * 32 + g_warps[w].size; i++) {
            const Thread* f = &g_threads[i];
            if (f->state == kDone) {
                fail("thread (%u,%u,%u) of block (%u,%u,%u) exited while others of its warp wait at %s",
                     f->tid.x, f->tid.y, f->tid.z, b.x, b.y, b.z, warp_kind_name(g_warps[w].kind));
                return;
            }
            if (f->state == kWaitBlock) {
                fail("deadlock in block (%u,%u,%u): thread (%u,%u,%u) waits at __syncthreads while "
                     "thread (%u,%u,%u) of its warp waits at %s",
                     b.x, b.y, b.z, f->tid.x, f->tid.y, f->tid.z, warp->tid.x, warp->tid.y,
                     warp->tid.z, warp_kind_name(g_warps[w].kind));
                return;
            }
        }
    }
    fail("deadlock in block (%u,%u,%u): no thread can proceed", b.x, b.y, b.z);
}

// Run one block to completion; false on an error (g_err set). Each pass runs the ready threads
// in thread order (reverse under DSV4_EMU_REVERSE), each until it finishes or waits; the fibers
// hand over to one another (wait_here, fiber_main) and come back here at the pass's end.
bool run_block() {
    unsigned n = g_nthreads;
    for (unsigned i = 0; i < n; i++) {
        g_threads[i].state = kReady;
        g_threads[i].exchanges = 0;
    }
    for (unsigned w = 0; w * 32 < n; w++) {
        g_warps[w].size = n - w * 32 < 32 ? n - w * 32 : 32;
        g_warps[w].arrived = 0;
        g_warps[w].kind = kNone;
    }
    g_block_arrived = 0;
    g_live = n;
    while (g_live > 0) {
        Thread* t = next_ready(0);
        if (!t) {
            report_stuck();
            return false;
        }
        if (!enter(t)) return false;
#ifdef DSV4_EMU_UCONTEXT
        swapcontext(&g_sched_uc, &t->fiber->uc);
#else
        dsv4_emu_switch(&g_sched_sp, t->fiber->sp);
#endif
        g_cur = nullptr;
        if (g_failed) return false;
    }
    return true;
}

// The running fiber arrives at its warp's barrier of kind `k`; returns when all lanes are there.
void warp_barrier(WarpKind k) {
    Thread* me = g_cur;
    Warp* w = &g_warps[me->linear / 32];
    if (w->arrived == 0) {
        w->kind = k;
    } else if (w->kind != k) {
        fail("threads of warp %u of block (%u,%u,%u) wait at different warp operations (%s and %s)",
             me->linear / 32, blockIdx.x, blockIdx.y, blockIdx.z, warp_kind_name(w->kind),
             warp_kind_name(k));
        to_scheduler();
        return; // not reached after a failure: the launch is abandoned
    }
    if (++w->arrived == w->size) {
        unsigned base = (me->linear / 32) * 32;
        for (unsigned i = base; i < base + w->size; i++)
            if (g_threads[i].state == kWaitWarp) g_threads[i].state = kReady;
        w->arrived = 0;
        w->kind = kNone;
        return;
    }
    me->state = kWaitWarp;
    wait_here();
}

} // namespace

extern "C" void dsv4_emu_syncthreads(void) {
    Thread* me = g_cur;
    if (++g_block_arrived == g_nthreads) {
        for (unsigned i = 0; i < g_nthreads; i++)
            if (g_threads[i].state == kWaitBlock) g_threads[i].state = kReady;
        g_block_arrived = 0;
        return;
    }
    me->state = kWaitBlock;
    wait_here();
}

extern "C" void dsv4_emu_syncwarp(void) { warp_barrier(kSyncwarp); }

extern "C" uint64_t dsv4_emu_shfl(uint64_t bits, int kind, int arg, int width) {
    Thread* me = g_cur;
    unsigned lane = me->linear % 32;
    Warp* w = &g_warps[me->linear / 32];
    if (width <= 0 || width > 32 || (width & (width - 1)) != 0) {
        fail("shuffle width %d is not a power of two in 1..32", width);
        to_scheduler();
    }
    unsigned seg = lane & ~(unsigned)(width - 1); // first lane of this lane's width-segment
    int src;
    switch (kind) {
    case 0: src = (int)seg + (arg & (width - 1)); break;
    case 1: src = (int)(lane ^ (unsigned)arg); if (src >= (int)seg + width) src = (int)lane; break;
    case 2: src = (int)lane - arg; if (src < (int)seg) src = (int)lane; break;
    default: src = (int)lane + arg; if (src >= (int)seg + width) src = (int)lane; break;
    }
    if (src < 0 || src >= (int)w->size) src = (int)lane; // a lane the block does not have
    uint64_t* slots = w->slots[me->exchanges++ & 1];
    slots[lane] = bits;
    warp_barrier(kShuffle);
    return slots[src];
}

extern "C" unsigned int dsv4_emu_ballot(int pred) {
    Thread* me = g_cur;
    unsigned lane = me->linear % 32;
    Warp* w = &g_warps[me->linear / 32];
    uint64_t* slots = w->slots[me->exchanges++ & 1];
    slots[lane] = pred != 0;
    warp_barrier(kBallot);
    unsigned b = 0;
    for (unsigned i = 0; i < w->size; i++) b |= (unsigned)(slots[i] != 0) << i;
    return b;
}

extern "C" void dsv4_emu_trap(void) {
    fail("thread (%u,%u,%u) of block (%u,%u,%u) called __trap()", threadIdx.x, threadIdx.y,
         threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z);
    to_scheduler();
}

// The alignment check. The kernel translation unit is compiled with -fsanitize=alignment (emu
// build.rs), so every load and store through a typed pointer first checks the address against
// the type's alignment and calls this handler when it is off. A GPU requires that alignment of
// every access (a 16-byte vector load from an address that is only 8-aligned faults with
// CUDA_ERROR_MISALIGNED_ADDRESS) while the CPU does not, so the launch fails here as it would
// there, naming the access. The data layout is the sanitizer ABI that GCC and Clang share
// (compiler-rt's ubsan_handlers.h); no sanitizer runtime is linked.
namespace {
struct UbsanLocation {
    const char* file;
    uint32_t line;
    uint32_t column;
};
struct UbsanType {
    uint16_t kind;
    uint16_t info;
    char name[1];
};
struct UbsanTypeMismatch {
    UbsanLocation loc;
    const UbsanType* type;
    unsigned char log_alignment;
    unsigned char check_kind;
};
// The check kinds a kernel can hit: a load, a store, or a use of the object (a copy binding
// a reference to it, a member access).
const char* access_kind(unsigned char k) { return k == 0 ? "load" : k == 1 ? "store" : "access"; }
} // namespace

extern "C" __attribute__((visibility("hidden"))) void
__ubsan_handle_type_mismatch_v1(UbsanTypeMismatch* d, uintptr_t ptr) {
    const unsigned long long align = 1ull << d->log_alignment;
    if (ptr == 0) {
        fail("thread (%u,%u,%u) of block (%u,%u,%u): %s of %s through a null pointer at %s:%u",
             threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z,
             access_kind(d->check_kind), d->type->name, d->loc.file, d->loc.line);
    } else {
        fail("thread (%u,%u,%u) of block (%u,%u,%u): misaligned %s of %s at 0x%llx (it needs "
             "%llu-byte alignment) at %s:%u; a GPU faults here (CUDA_ERROR_MISALIGNED_ADDRESS)",
             threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z,
             access_kind(d->check_kind), d->type->name, (unsigned long long)ptr, align,
             d->loc.file, d->loc.line);
    }
    if (g_cur != nullptr) to_scheduler(); // the thread stops, as after __trap()
    fprintf(stderr, "%s\n", g_err);   // not in a kernel: the emulator itself is wrong
    abort();
}
extern "C" __attribute__((visibility("hidden"))) void
__ubsan_handle_type_mismatch_v1_abort(UbsanTypeMismatch* d, uintptr_t ptr) {
    __ubsan_handle_type_mismatch_v1(d, ptr);
}

// The bounds of the section every __shared__ array is in (emu/shim.h), defined by the linker;
// weak, so a translation unit without shared memory links too.
extern "C" char __start_dsv4_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_dsv4_shared[] __attribute__((weak, visibility("hidden")));

extern "C" int dsv4_emu_schedule(const char* name, dsv4_emu_dim3 grid, dsv4_emu_dim3 block,
                                 void (*body)(void*), void* ctx, char* err, size_t errlen) {
    g_name = name;
    g_failed = false;
    g_err[0] = 0;
    unsigned long long n = (unsigned long long)block.x * block.y * block.z;
    if (block.x == 0 || block.y == 0 || block.z == 0 || n > kMaxThreads || block.z > 64) {
        fail("invalid block (%u,%u,%u): CUDA allows 1..1024 threads per block, z <= 64", block.x,
             block.y, block.z);
    } else if (grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
        fail("invalid grid (%u,%u,%u): CUDA allows x < 2^31, y and z <= 65535", grid.x, grid.y,
             grid.z);
    }
    if (!g_failed) {
        uintptr_t lo = (uintptr_t)__start_dsv4_shared, hi = (uintptr_t)__stop_dsv4_shared;
        if (lo != 0 && hi > lo) memset(__start_dsv4_shared, 0xFF, (size_t)(hi - lo));
        g_nthreads = (unsigned)n;
        g_body = body;
        g_ctx = ctx;
        gridDim = grid;
        blockDim = block;
        for (unsigned i = 0; i < n; i++) {
            g_threads[i].fiber = nullptr;
            g_threads[i].linear = i;
            g_threads[i].tid = dsv4_emu_dim3{i % block.x, (i / block.x) % block.y,
                                            i / (block.x * block.y)};
        }
        for (unsigned z = 0; z < grid.z && !g_failed; z++)
            for (unsigned y = 0; y < grid.y && !g_failed; y++)
                for (unsigned x = 0; x < grid.x; x++) {
#ifdef DSV4_EMU_REVERSE
                    blockIdx = dsv4_emu_dim3{grid.x - 1 - x, grid.y - 1 - y, grid.z - 1 - z};
#else
                    blockIdx = dsv4_emu_dim3{x, y, z};
#endif
                    if (!run_block()) break;
                }
    }
    if (g_failed) {
        // Fibers stopped mid-kernel are abandoned: restart their contexts on the next launch.
        g_nfree = 0;
        for (unsigned i = 0; i < g_pool; i++) {
            g_fibers[i].started = false;
            g_free[g_nfree++] = &g_fibers[i];
        }
        snprintf(err, errlen, "%s", g_err);
        return 1;
    }
    return 0;
}
