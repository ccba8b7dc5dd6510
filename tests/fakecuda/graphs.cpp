// CUDA graphs: graphs, kernel and child-graph nodes, instantiation, update
// and launch. Stream capture (capture.cpp) builds graphs through the same
// helpers (state.h).
//
// Handles (CUgraph, CUgraphNode, CUgraphExec) are pointers to objects of this
// process's Driver state, checked against its tables: a bad one gives
// CUDA_ERROR_INVALID_VALUE, as the real driver answers for graphs. A node's
// dependencies are nodes of its graph that exist when it is added, so the
// insertion order is an execution order. A kernel node records its function,
// grid and block; for a handshake kernel ("ncclDevKernel_Handshake*",
// kernels.cpp) also its three 8-byte arguments, by value (kernelParams reads
// them back from storage owned by the node). A child-graph node owns a clone
// of the graph it was given.
//
// An exec is a snapshot taken at instantiation: the kernel nodes in order,
// child graphs inlined. cuGraphLaunch queues its handshake nodes on the stream
// one after the other, exactly as that many cuLaunchKernel calls would
// (other kernels do nothing, as their launches do, and so do event-wait
// nodes); nodes of parallel branches (streams joined into a capture) run one
// after the other too, in insertion order. A handshake node captured
// with step 0 advances its flag by one at every replay (kernels.cpp).
// cuGraphExecUpdate takes the kernels and arguments of a graph with the same
// structure (node types and edges, depth first); a kernel node may name
// another function, as drivers from CUDA 11.2 on allow within one context
// (the simulated modules belong to no context). Otherwise it fails
// CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE (TOPOLOGY_CHANGED or NODE_TYPE_CHANGED)
// and the exec keeps what it had.
//
// The driver checkpoint leaves graphs and execs alone (host memory; flag
// addresses are resolved when a node runs); a forked child starts with none.
#include "gate.h"
#include "state.h"

#include <algorithm>

using namespace fc;

namespace fc {

Graph* graph_new(GraphNode* parent) {
  auto* g = new Graph;
  g->parent = parent;
  driver().graphs.insert(g);
  return g;
}

void graph_free(Graph* g) {
  if (!g) return;
  Driver& d = driver();
  for (GraphNode* n : g->nodes) {
    graph_free(n->child);
    d.graph_nodes.erase(n);
    delete n;
  }
  for (auto& [key, c] : d.captures)
    if (c.seq->graph == g) {  // its nodes are gone: forget them
      c.seq->graph = nullptr;
      c.seq->invalidated = true;
      c.seq->left.clear();
      c.deps.clear();
    }
  d.graphs.erase(g);
  delete g;
}

GraphNode* graph_add_node(Graph* g, CUgraphNodeType type, std::vector<GraphNode*> deps) {
  auto* n = new GraphNode;
  n->graph = g;
  n->type = type;
  n->deps = std::move(deps);
  g->nodes.push_back(n);
  driver().graph_nodes.insert(n);
  return n;
}

CUresult graph_add_kernel(Graph* g, std::vector<GraphNode*> deps, CUfunction f, CUcontext ctx,
                          const LaunchDims& dims, void** params, void** extra, GraphNode** out) {
  auto* fn = reinterpret_cast<Function*>(f);
  HandshakeArgs a;
  if (fn->handshake && !handshake_args(params, extra, &a)) return CUDA_ERROR_INVALID_VALUE;
  GraphNode* n = graph_add_node(g, CU_GRAPH_NODE_TYPE_KERNEL, std::move(deps));
  n->func = f;
  n->ctx = ctx;
  std::copy(dims.grid, dims.grid + 3, n->grid);
  std::copy(dims.block, dims.block + 3, n->block);
  n->shared_mem = dims.shared_mem;
  n->handshake = fn->handshake;
  if (n->handshake) {
    n->words[0] = a.my_flag;
    n->words[1] = a.peer_flag;
    n->words[2] = a.step;
  }
  for (int i = 0; i < 3; ++i) n->params[i] = &n->words[i];
  if (out) *out = n;
  return CUDA_SUCCESS;
}

}  // namespace fc

namespace {

Graph* graph_of(CUgraph h) {
  auto* g = reinterpret_cast<Graph*>(h);
  return h && driver().graphs.count(g) ? g : nullptr;
}
GraphNode* node_of(CUgraphNode h) {
  auto* n = reinterpret_cast<GraphNode*>(h);
  return h && driver().graph_nodes.count(n) ? n : nullptr;
}
GraphExec* exec_of(CUgraphExec h) {
  auto* e = reinterpret_cast<GraphExec*>(h);
  return h && driver().graph_execs.count(e) ? e : nullptr;
}

/// A deep copy of src (nested child graphs too) owned by `parent`.
Graph* clone(const Graph* src, GraphNode* parent) {
  Graph* g = graph_new(parent);
  std::vector<GraphNode*> made;
  for (const GraphNode* s : src->nodes) {
    std::vector<GraphNode*> deps;
    for (GraphNode* d : s->deps) {
      size_t i = std::find(src->nodes.begin(), src->nodes.end(), d) - src->nodes.begin();
      deps.push_back(made[i]);
    }
    GraphNode* n = graph_add_node(g, s->type, std::move(deps));
    n->func = s->func;
    n->ctx = s->ctx;
    std::copy(s->grid, s->grid + 3, n->grid);
    std::copy(s->block, s->block + 3, n->block);
    n->shared_mem = s->shared_mem;
    n->handshake = s->handshake;
    std::copy(s->words, s->words + 3, n->words);
    for (int i = 0; i < 3; ++i) n->params[i] = &n->words[i];
    n->child = s->child ? clone(s->child, n) : nullptr;
    made.push_back(n);
  }
  return g;
}

/// Validates (deps, n) as distinct nodes of g.
bool deps_of(Graph* g, const CUgraphNode* deps, size_t n, std::vector<GraphNode*>* out) {
  if (n && !deps) return false;
  for (size_t i = 0; i < n; ++i) {
    GraphNode* d = node_of(deps[i]);
    if (!d || d->graph != g || std::count(out->begin(), out->end(), d)) return false;
    out->push_back(d);
  }
  return true;
}

/// Flattens g depth first: the kernels to run, the structure an update must
/// keep, and the node behind each structure entry.
void flatten(const Graph* g, std::vector<ExecKernel>* kernels, std::vector<ShapeEntry>* shape,
             std::vector<GraphNode*>* nodes) {
  for (GraphNode* n : g->nodes) {
    ShapeEntry e;
    e.type = static_cast<int>(n->type);
    e.func = n->type == CU_GRAPH_NODE_TYPE_KERNEL ? n->func : nullptr;
    for (GraphNode* d : n->deps)
      e.deps.push_back(std::find(g->nodes.begin(), g->nodes.end(), d) - g->nodes.begin());
    shape->push_back(std::move(e));
    if (nodes) nodes->push_back(n);
    if (n->type == CU_GRAPH_NODE_TYPE_GRAPH) {
      flatten(n->child, kernels, shape, nodes);
      shape->push_back(ShapeEntry{});  // end of the child graph
      if (nodes) nodes->push_back(n);
      continue;
    }
    ExecKernel k;
    k.func = n->func;
    k.handshake = n->handshake;
    std::copy(n->words, n->words + 3, k.words);
    kernels->push_back(k);
  }
}

CUresult add_kernel(CUgraphNode* ph, CUgraph hg, const CUgraphNode* deps, size_t ndeps,
                    CUfunction f, CUcontext ctx, const LaunchDims& dims, void** params,
                    void** extra) {
  FC_REQUIRE_INIT();
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  Graph* g = graph_of(hg);
  std::vector<GraphNode*> dv;
  if (!ph || !g || !deps_of(g, deps, ndeps, &dv)) return CUDA_ERROR_INVALID_VALUE;
  if (!f || !d.functions.count(reinterpret_cast<Function*>(f))) return CUDA_ERROR_INVALID_VALUE;
  for (int i = 0; i < 3; ++i)
    if (!dims.grid[i] || !dims.block[i]) return CUDA_ERROR_INVALID_VALUE;
  GraphNode* n = nullptr;
  if (CUresult r = graph_add_kernel(g, std::move(dv), f, ctx, dims, params, extra, &n)) return r;
  *ph = reinterpret_cast<CUgraphNode>(n);
  return CUDA_SUCCESS;
}

template <typename P>
LaunchDims dims_of(const P& p) {
  LaunchDims d;
  d.grid[0] = p.gridDimX, d.grid[1] = p.gridDimY, d.grid[2] = p.gridDimZ;
  d.block[0] = p.blockDimX, d.block[1] = p.blockDimY, d.block[2] = p.blockDimZ;
  d.shared_mem = p.sharedMemBytes;
  return d;
}

/// Fills the fields CUDA_KERNEL_NODE_PARAMS v1 and v2 share.
/// Precondition: Driver::mu held.
template <typename P>
CUresult kernel_params(CUgraphNode h, P* p) {
  GraphNode* n = node_of(h);
  if (!p || !n || n->type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
  p->func = n->func;
  p->gridDimX = n->grid[0], p->gridDimY = n->grid[1], p->gridDimZ = n->grid[2];
  p->blockDimX = n->block[0], p->blockDimY = n->block[1], p->blockDimZ = n->block[2];
  p->sharedMemBytes = n->shared_mem;
  // A handshake node's arguments live in the node; other kernels' were not kept.
  p->kernelParams = n->handshake ? n->params : nullptr;
  p->extra = nullptr;
  return CUDA_SUCCESS;
}

constexpr unsigned long long kInstantiateFlags =
    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
    CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;

CUresult instantiate(CUgraphExec* ph, CUgraph hg, unsigned long long flags) {
  FC_REQUIRE_INIT();
  Driver& d = driver();
  std::lock_guard<std::mutex> l(d.mu);
  Graph* g = graph_of(hg);
  if (!ph || !g || (flags & ~kInstantiateFlags)) return CUDA_ERROR_INVALID_VALUE;
  auto* e = new GraphExec;
  e->flags = flags;
  flatten(g, &e->kernels, &e->shape, nullptr);
  d.graph_execs.insert(e);
  *ph = reinterpret_cast<CUgraphExec>(e);
  return CUDA_SUCCESS;
}

CUresult instantiate_old(CUgraphExec* ph, CUgraph hg, CUgraphNode* err_node, char* log,
                         size_t log_size) {
  if (err_node) *err_node = nullptr;
  if (log && log_size) log[0] = '\0';
  return instantiate(ph, hg, 0);
}

CUresult instantiate_params(CUgraphExec* ph, CUgraph hg, CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  p->hErrNode_out = nullptr;
  CUresult r = instantiate(ph, hg, p->flags);
  p->result_out = r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
  return r;
}

/// cuGraphExecUpdate: *result and *err_node say why it failed.
CUresult exec_update(CUgraphExec he, CUgraph hg, CUgraphExecUpdateResult* result,
                     CUgraphNode* err_node) {
  *result = CU_GRAPH_EXEC_UPDATE_ERROR;
  *err_node = nullptr;
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  GraphExec* e = exec_of(he);
  Graph* g = graph_of(hg);
  if (!e || !g) return CUDA_ERROR_INVALID_VALUE;
  std::vector<ExecKernel> kernels;
  std::vector<ShapeEntry> shape;
  std::vector<GraphNode*> nodes;
  flatten(g, &kernels, &shape, &nodes);
  CUgraphExecUpdateResult why = CU_GRAPH_EXEC_UPDATE_SUCCESS;
  size_t at = 0;
  if (shape.size() != e->shape.size()) {
    why = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    at = std::min(shape.size(), e->shape.size());
  }
  for (size_t i = 0; !why && i < shape.size(); ++i) {
    const ShapeEntry &now = shape[i], &was = e->shape[i];
    at = i;
    if (now.deps != was.deps)
      why = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    else if (now.type != was.type)
      why = CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
  }
  *result = why;
  if (why != CU_GRAPH_EXEC_UPDATE_SUCCESS) {
    if (at < nodes.size()) *err_node = reinterpret_cast<CUgraphNode>(nodes[at]);
    return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  }
  e->kernels = std::move(kernels);
  e->shape = std::move(shape);
  return CUDA_SUCCESS;
}

/// Queues the exec's handshake nodes on the stream, in order.
CUresult graph_launch(CUgraphExec he, CUstream s, bool ptsz) {
  FC_REQUIRE_INIT();
  StreamKey key;
  std::vector<HandshakeArgs> run;
  {
    std::lock_guard<std::mutex> l(driver().mu);
    GraphExec* e = exec_of(he);
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    if (!resolve_stream(s, ptsz, &key)) return CUDA_ERROR_INVALID_CONTEXT;
    if (CUresult r = capture_refuse(key)) return r;
    for (const ExecKernel& k : e->kernels)
      if (k.handshake) run.push_back(HandshakeArgs{k.words[0], k.words[1], k.words[2]});
  }
  for (const HandshakeArgs& a : run) kernel_enqueue(key, a);
  return CUDA_SUCCESS;
}

}  // namespace

FC_EXPORT CUresult cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  FC_ENTER("cuGraphCreate");
  FC_REQUIRE_INIT();
  if (!phGraph || flags) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> l(driver().mu);
  *phGraph = reinterpret_cast<CUgraph>(graph_new(nullptr));
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) {
  FC_ENTER("cuGraphDestroy");
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  Graph* g = graph_of(hGraph);
  if (!g || g->parent) return CUDA_ERROR_INVALID_VALUE;  // a child graph is its node's
  graph_free(g);
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode* phGraphNode, CUgraph hGraph,
                                           const CUgraphNode* dependencies, size_t numDependencies,
                                           const CUDA_KERNEL_NODE_PARAMS* p) {
  FC_ENTER("cuGraphAddKernelNode");
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  // A library kernel (kern) stands for its function when func is NULL.
  CUfunction f = p->func ? p->func : reinterpret_cast<CUfunction>(p->kern);
  CUcontext ctx = p->func ? nullptr : p->ctx;
  if (!ctx) {
    std::lock_guard<std::mutex> l(driver().mu);
    ctx = reinterpret_cast<CUcontext>(current_ctx());
  }
  return add_kernel(phGraphNode, hGraph, dependencies, numDependencies, f, ctx, dims_of(*p),
                    p->kernelParams, p->extra);
}
FC_EXPORT CUresult cuGraphAddKernelNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                        const CUgraphNode* dependencies, size_t numDependencies,
                                        const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  FC_ENTER("cuGraphAddKernelNode");
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  CUcontext ctx;
  {
    std::lock_guard<std::mutex> l(driver().mu);
    ctx = reinterpret_cast<CUcontext>(current_ctx());
  }
  return add_kernel(phGraphNode, hGraph, dependencies, numDependencies, p->func, ctx,
                    dims_of(*p), p->kernelParams, p->extra);
}

FC_EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                            const CUgraphNode* dependencies,
                                            size_t numDependencies, CUgraph childGraph) {
  FC_ENTER("cuGraphAddChildGraphNode");
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  Graph *g = graph_of(hGraph), *child = graph_of(childGraph);
  std::vector<GraphNode*> deps;
  if (!phGraphNode || !g || !child || child == g ||
      !deps_of(g, dependencies, numDependencies, &deps))
    return CUDA_ERROR_INVALID_VALUE;
  GraphNode* n = graph_add_node(g, CU_GRAPH_NODE_TYPE_GRAPH, std::move(deps));
  n->child = clone(child, n);
  *phGraphNode = reinterpret_cast<CUgraphNode>(n);
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph* phGraph) {
  FC_ENTER("cuGraphChildGraphNodeGetGraph");
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  GraphNode* n = node_of(hNode);
  if (!phGraph || !n || n->type != CU_GRAPH_NODE_TYPE_GRAPH) return CUDA_ERROR_INVALID_VALUE;
  *phGraph = reinterpret_cast<CUgraph>(n->child);  // still the node's
  return CUDA_SUCCESS;
}

/// nodes NULL: *numNodes = the count. Otherwise fills up to *numNodes
/// entries; when *numNodes is larger, the rest become NULL and *numNodes the
/// count.
FC_EXPORT CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode* nodes, size_t* numNodes) {
  FC_ENTER("cuGraphGetNodes");
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  Graph* g = graph_of(hGraph);
  if (!g || !numNodes) return CUDA_ERROR_INVALID_VALUE;
  const size_t count = g->nodes.size();
  if (!nodes) {
    *numNodes = count;
    return CUDA_SUCCESS;
  }
  for (size_t i = 0; i < *numNodes; ++i)
    nodes[i] = i < count ? reinterpret_cast<CUgraphNode>(g->nodes[i]) : nullptr;
  *numNodes = std::min(*numNodes, count);
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType* type) {
  FC_ENTER("cuGraphNodeGetType");
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  GraphNode* n = node_of(hNode);
  if (!type || !n) return CUDA_ERROR_INVALID_VALUE;
  *type = n->type;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS* p) {
  FC_ENTER("cuGraphKernelNodeGetParams");
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  if (CUresult r = kernel_params(hNode, p)) return r;
  p->kern = nullptr;
  p->ctx = reinterpret_cast<GraphNode*>(hNode)->ctx;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuGraphKernelNodeGetParams(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS_v1* p) {
  FC_ENTER("cuGraphKernelNodeGetParams");
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  return kernel_params(hNode, p);
}

FC_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph,
                                               unsigned long long flags) {
  FC_ENTER("cuGraphInstantiateWithFlags");
  return instantiate(phGraphExec, hGraph, flags);
}
FC_EXPORT CUresult cuGraphInstantiate(CUgraphExec* phGraphExec, CUgraph hGraph,
                                      CUgraphNode* phErrorNode, char* logBuffer,
                                      size_t bufferSize) {
  FC_ENTER("cuGraphInstantiate");
  return instantiate_old(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}
FC_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec* phGraphExec, CUgraph hGraph,
                                         CUgraphNode* phErrorNode, char* logBuffer,
                                         size_t bufferSize) {
  FC_ENTER("cuGraphInstantiate");
  return instantiate_old(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}
FC_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  FC_ENTER("cuGraphInstantiateWithParams");
  return instantiate_params(phGraphExec, hGraph, params);
}
FC_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                     CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  FC_ENTER("cuGraphInstantiateWithParams");
  return instantiate_params(phGraphExec, hGraph, params);
}
FC_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  FC_ENTER("cuGraphExecDestroy");
  FC_REQUIRE_INIT();
  std::lock_guard<std::mutex> l(driver().mu);
  GraphExec* e = exec_of(hGraphExec);
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  driver().graph_execs.erase(e);
  delete e;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
                                        CUgraphExecUpdateResultInfo* resultInfo) {
  FC_ENTER("cuGraphExecUpdate");
  if (!resultInfo) return CUDA_ERROR_INVALID_VALUE;
  resultInfo->errorFromNode = nullptr;
  return exec_update(hGraphExec, hGraph, &resultInfo->result, &resultInfo->errorNode);
}
FC_EXPORT CUresult cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph,
                                     CUgraphNode* hErrorNode_out,
                                     CUgraphExecUpdateResult* updateResult_out) {
  FC_ENTER("cuGraphExecUpdate");
  if (!hErrorNode_out || !updateResult_out) return CUDA_ERROR_INVALID_VALUE;
  return exec_update(hGraphExec, hGraph, updateResult_out, hErrorNode_out);
}

FC_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  FC_ENTER("cuGraphLaunch");
  return graph_launch(hGraphExec, hStream, false);
}
FC_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  FC_ENTER("cuGraphLaunch");
  return graph_launch(hGraphExec, hStream, true);
}
