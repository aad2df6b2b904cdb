// The emulated CUDA driver's asynchrony: each stream's work waits in a queue until something
// needs it, and then runs in the latest, most adversarial order CUDA's rules allow.
//
// What forces work to run: cuStreamSynchronize (the stream's work, and the work on other streams
// its event waits name, up to those records); cuCtxSynchronize, cuMemFree, cuMemFreeHost and
// cuModuleUnload (everything); a copy into pageable host memory (its stream up to the copy, as
// the call returns only once the copy is done). Everything else stays queued. Waiting for
// everything runs, each time, the newest queued work that may run, so work on another stream that
// no event orders before its consumer runs after the consumer, and a missing event shows as a
// wrong result instead of being hidden by issue order.
//
// CUDA's ordering rules, as modelled: work on one stream runs in issue order; cuStreamWaitEvent
// orders the stream's later work after the work issued on the event's stream before its last
// cuEventRecord (no wait when the event was never recorded); the legacy stream orders work with
// streams created without CU_STREAM_NON_BLOCKING both ways, and not at all with non-blocking
// ones. A copy from pageable host memory takes its bytes when issued (the driver stages them);
// from page-locked memory when it runs, and a copy into page-locked memory writes it when it runs.
// A kernel fault in queued work is sticky and returned by every later call.

#include "driver.h"

namespace emu_driver {

namespace {

const std::shared_ptr<Queue>& queue_of(void* st) {
    // null, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) are the legacy stream here.
    if (st == nullptr || st == (void*)1 || st == (void*)2) return S().queues[0];
    return ((Stream*)st)->q;
}

// Run `q`'s work until `upto` of its items have run (each item first runs what it waits for).
CUresult drain(Queue& q, unsigned long long upto) {
    while (q.done < upto && !q.pending.empty() && S().sticky == CUDA_SUCCESS) {
        Work w = std::move(q.pending.front());
        q.pending.pop_front();
        CUresult rc = w.run();
        q.done++;
        if (rc != CUDA_SUCCESS) return rc;
    }
    return S().sticky;
}

// An item that waits until `upto` items of `q` have run.
std::function<CUresult()> wait_for(std::shared_ptr<Queue> q, unsigned long long upto) {
    return [q, upto] { return drain(*q, upto); };
}

void push(Queue& q, std::function<CUresult()> run) {
    q.pending.push_back(Work{++S().issued, std::move(run)});
    q.issued++;
}

}  // namespace

CUresult enqueue(void* st, std::function<CUresult()> run) {
    const std::shared_ptr<Queue>& q = queue_of(st);
    const std::shared_ptr<Queue>& legacy = S().queues[0];
    if (q == legacy) {
        // The legacy stream waits for the work of every blocking stream issued before.
        for (const auto& b : S().queues)
            if (b->blocking && b->done < b->issued) push(*q, wait_for(b, b->issued));
    } else if (q->blocking && legacy->done < legacy->issued) {
        push(*q, wait_for(legacy, legacy->issued));
    }
    push(*q, std::move(run));
    if (!S().deferred) return drain(*q, q->issued);
    return CUDA_SUCCESS;
}

CUresult drain_stream(void* st) {
    const std::shared_ptr<Queue> q = queue_of(st);
    return drain(*q, q->issued);
}

CUresult drain_all() {
    State& s = S();
    while (s.sticky == CUDA_SUCCESS) {
        Queue* next = nullptr;
        for (const auto& q : s.queues)
            if (!q->pending.empty() && (next == nullptr ||
                                        q->pending.front().order > next->pending.front().order))
                next = q.get();
        if (next == nullptr) break;
        if (CUresult rc = drain(*next, next->done + 1)) return rc;
    }
    auto& qs = s.queues;
    qs.erase(std::remove_if(qs.begin() + 1, qs.end(),
                            [](const std::shared_ptr<Queue>& q) {
                                return q->orphan && q->pending.empty();
                            }),
             qs.end());
    return s.sticky;
}

}  // namespace emu_driver

using namespace emu_driver;

// ---- memsets and copies ----

API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, void* stream) {
    NEED_CTX("cuMemsetD8Async");
    NEED_STREAM("cuMemsetD8Async", stream);
    if (!in_device(dst, n))
        return fail(CUDA_ERROR_INVALID_VALUE,
                    "cuMemsetD8Async(0x%llx, %zu): outside every allocation", dst, n);
    if (n == 0) return CUDA_SUCCESS;
    return enqueue(stream, [dst, v, n] {
        memset((void*)(uintptr_t)dst, v, n);
        return CUDA_SUCCESS;
    });
}

API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, void* stream) {
    NEED_CTX("cuMemcpyHtoDAsync");
    NEED_STREAM("cuMemcpyHtoDAsync", stream);
    if (!in_device(dst, n))
        return fail(CUDA_ERROR_INVALID_VALUE,
                    "cuMemcpyHtoDAsync(0x%llx, %zu): outside every allocation", dst, n);
    if (n == 0) return CUDA_SUCCESS;
    if (in_map(S().host, (CUdeviceptr)(uintptr_t)src, n)) {
        // Page-locked: the copy reads the source when it runs.
        return enqueue(stream, [dst, src, n] {
            memcpy((void*)(uintptr_t)dst, src, n);
            return CUDA_SUCCESS;
        });
    }
    // Pageable: the driver stages the bytes before the call returns.
    auto staged = std::make_shared<std::vector<unsigned char>>((const unsigned char*)src,
                                                               (const unsigned char*)src + n);
    return enqueue(stream, [dst, staged] {
        memcpy((void*)(uintptr_t)dst, staged->data(), staged->size());
        return CUDA_SUCCESS;
    });
}

API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, void* stream) {
    NEED_CTX("cuMemcpyDtoHAsync");
    NEED_STREAM("cuMemcpyDtoHAsync", stream);
    if (!in_device(src, n))
        return fail(CUDA_ERROR_INVALID_VALUE,
                    "cuMemcpyDtoHAsync(0x%llx, %zu): outside every allocation", src, n);
    if (n == 0) return CUDA_SUCCESS;
    CUresult rc = enqueue(stream, [dst, src, n] {
        memcpy(dst, (const void*)(uintptr_t)src, n);
        return CUDA_SUCCESS;
    });
    if (rc != CUDA_SUCCESS || in_map(S().host, (CUdeviceptr)(uintptr_t)dst, n)) return rc;
    // Into pageable memory the call returns once the copy is done.
    return drain_stream(stream);
}

// ---- launches ----

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
    const unsigned block[3] = {bx, by, bz};
    if (CUresult rc = check_launch(f, block, params)) return rc;
    // The driver copies the argument values now; the launch runs when its stream gets there.
    auto args = std::make_shared<std::vector<std::vector<unsigned char>>>(copy_args(f, params));
    return enqueue(stream, [f, gx, gy, gz, bx, by, bz, args] {
        std::vector<void*> ptrs;
        for (auto& a : *args) ptrs.push_back(a.data());
        const unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
        return execute(f, g, b, ptrs.data());
    });
}

// ---- streams, events, synchronisation ----

API CUresult cuCtxSynchronize(void) {
    NEED_CTX("cuCtxSynchronize");
    return drain_all();
}

API CUresult cuStreamCreate(void** stream, unsigned flags) {
    NEED_CTX("cuStreamCreate");
    if (flags > 1) return fail(CUDA_ERROR_INVALID_VALUE, "cuStreamCreate: flags %u", flags);
    Stream* s = new Stream{flags, std::make_shared<Queue>()};
    s->q->blocking = (flags & 1) == 0;  // CU_STREAM_NON_BLOCKING is 1
    S().queues.push_back(s->q);
    S().streams.insert(s);
    *stream = s;
    return CUDA_SUCCESS;
}

API CUresult cuStreamDestroy_v2(void* stream) {
    NEED_CTX("cuStreamDestroy");
    if (S().streams.erase(stream) == 0)
        return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy(%p): not a created stream", stream);
    // As on a GPU the call returns at once; the stream's queued work still runs.
    Stream* s = (Stream*)stream;
    s->q->orphan = true;
    delete s;
    return CUDA_SUCCESS;
}

API CUresult cuStreamSynchronize(void* stream) {
    NEED_CTX("cuStreamSynchronize");
    NEED_STREAM("cuStreamSynchronize", stream);
    return drain_stream(stream);
}

API CUresult cuEventCreate(void** event, unsigned flags) {
    NEED_CTX("cuEventCreate");
    if (flags > 0xf) return fail(CUDA_ERROR_INVALID_VALUE, "cuEventCreate: flags %u", flags);
    Event* e = new Event{nullptr, 0};
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
    Event* e = (Event*)event;
    e->q = queue_of(stream);
    e->at = e->q->issued;
    return CUDA_SUCCESS;
}

API CUresult cuStreamWaitEvent(void* stream, void* event, unsigned flags) {
    NEED_CTX("cuStreamWaitEvent");
    NEED_STREAM("cuStreamWaitEvent", stream);
    if (S().events.count(event) == 0)
        return fail(CUDA_ERROR_INVALID_HANDLE, "cuStreamWaitEvent(%p): not an event", event);
    if (flags != 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuStreamWaitEvent: flags %u", flags);
    const Event* e = (const Event*)event;
    // The wait is for the record made before this call; one never recorded is no wait.
    if (e->q == nullptr || e->q == queue_of(stream)) return CUDA_SUCCESS;
    return enqueue(stream, wait_for(e->q, e->at));
}
