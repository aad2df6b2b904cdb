// The emulated CUDA driver's graphs: kernel nodes with their argument values copied when added,
// instantiation in a topological order, replay on a stream (queued as one piece of work).

#include "driver.h"

using namespace emu_driver;

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
    n->args = copy_args(f, p->kernel_params);
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
    auto nodes = std::make_shared<std::vector<Node>>();
    for (const Node* n : ((Graph*)graph)->nodes) nodes->push_back(*n);
    Exec* e = new Exec{nodes};
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
    std::shared_ptr<const std::vector<Node>> nodes = ((Exec*)exec)->nodes;
    for (const Node& n : *nodes) {
        if (S().funcs.count(n.func) == 0)
            return fail(CUDA_ERROR_INVALID_HANDLE, "cuGraphLaunch: a node's module was unloaded");
        std::vector<void*> ptrs;
        for (auto& a : n.args) ptrs.push_back((void*)a.data());
        if (CUresult rc = check_launch(n.func, n.block, ptrs.data())) return rc;
    }
    // The nodes run one after another when the stream gets to the graph, even if the
    // executable graph is destroyed before that.
    return enqueue(stream, [nodes]() -> CUresult {
        for (const Node& n : *nodes) {
            std::vector<void*> ptrs;
            for (auto& a : n.args) ptrs.push_back((void*)a.data());
            if (CUresult rc = execute(n.func, n.grid, n.block, ptrs.data())) return rc;
        }
        return CUDA_SUCCESS;
    });
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
