/*
 * A stub of the CUDA driver (libcuda.so.1) for testing cachealloc-cuda's
 * FFI without a GPU: the entry points cudarc resolves for the backend and
 * its tests, over the state machine of stub_core.h. Error codes are the
 * driver's (CUresult), and only ones cudarc's enum lists.
 */
#define STUB_IMPLICIT_DEVICE 0
#include "stub_core.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_MAP_FAILED = 205,
    CUDA_ERROR_ALREADY_MAPPED = 208,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
    CUDA_ERROR_CAPTURED_EVENT = 907,
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
    CUDA_ERROR_UNKNOWN = 999,
};

/* The driver's code for what an entry point found. */
static CUresult cu(stub_status s) {
    switch (s) {
    case ST_OK: return CUDA_SUCCESS;
    case ST_INJECTED: return stub_injected_code;
    case ST_INVALID_VALUE: return CUDA_ERROR_INVALID_VALUE;
    case ST_OUT_OF_MEMORY: return CUDA_ERROR_OUT_OF_MEMORY;
    case ST_NOT_INITIALIZED: return CUDA_ERROR_NOT_INITIALIZED;
    case ST_NO_DEVICE: return CUDA_ERROR_NO_DEVICE;
    case ST_INVALID_DEVICE: return CUDA_ERROR_INVALID_DEVICE;
    case ST_INVALID_CONTEXT: return CUDA_ERROR_INVALID_CONTEXT;
    case ST_BAD_HANDLE: return CUDA_ERROR_INVALID_HANDLE;
    case ST_NOT_READY: return CUDA_ERROR_NOT_READY;
    case ST_MAP_FAILED: return CUDA_ERROR_MAP_FAILED;
    case ST_ALREADY_MAPPED: return CUDA_ERROR_ALREADY_MAPPED;
    case ST_PEER_UNSUPPORTED: return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    case ST_PEER_ALREADY_ENABLED: return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    case ST_ILLEGAL_STATE: return CUDA_ERROR_ILLEGAL_STATE;
    case ST_CAPTURE_UNSUPPORTED: return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    case ST_CAPTURE_INVALIDATED: return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    case ST_CAPTURE_UNMATCHED: return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
    case ST_CAPTURE_UNJOINED: return CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
    case ST_CAPTURE_ISOLATION: return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    case ST_CAPTURE_IMPLICIT: return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    case ST_CAPTURED_EVENT: return CUDA_ERROR_CAPTURED_EVENT;
    case ST_CAPTURE_WRONG_THREAD: return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    }
    return CUDA_ERROR_UNKNOWN;
}

#define ENTER(name)                                                            \
    pthread_mutex_lock(&stub_lock);                                            \
    do {                                                                       \
        int injected_ = stub_enter_locked(name);                               \
        if (injected_) {                                                       \
            pthread_mutex_unlock(&stub_lock);                                  \
            return injected_;                                                  \
        }                                                                      \
    } while (0)
#define LEAVE(code)                                                            \
    do {                                                                       \
        CUresult r_ = (code);                                                  \
        pthread_mutex_unlock(&stub_lock);                                      \
        return r_;                                                             \
    } while (0)
STUB_EXPORT CUresult cuInit(unsigned flags) {
    ENTER("cuInit");
    if (flags != 0) LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (stub_devices == 0) LEAVE(CUDA_ERROR_NO_DEVICE);
    stub_initialized = 1;
    LEAVE(CUDA_SUCCESS);
}

STUB_EXPORT CUresult cuDeviceGetCount(int *count) {
    ENTER("cuDeviceGetCount");
    if (!stub_initialized) LEAVE(CUDA_ERROR_NOT_INITIALIZED);
    if (!count) LEAVE(CUDA_ERROR_INVALID_VALUE);
    *count = stub_devices;
    LEAVE(CUDA_SUCCESS);
}

STUB_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    ENTER("cuDeviceGet");
    if (!stub_initialized) LEAVE(CUDA_ERROR_NOT_INITIALIZED);
    if (!device) LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (ordinal < 0 || ordinal >= stub_devices) LEAVE(CUDA_ERROR_INVALID_DEVICE);
    *device = ordinal;
    LEAVE(CUDA_SUCCESS);
}

STUB_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device) {
    ENTER("cuDevicePrimaryCtxRetain");
    if (!stub_initialized) LEAVE(CUDA_ERROR_NOT_INITIALIZED);
    if (!ctx) LEAVE(CUDA_ERROR_INVALID_VALUE);
    if (device < 0 || device >= stub_devices) LEAVE(CUDA_ERROR_INVALID_DEVICE);
    stub_dev[device].ctx_refs++;
    *ctx = stub_handle(STUB_CONTEXT_BASE, (size_t)device);
    LEAVE(CUDA_SUCCESS);
}

STUB_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    ENTER("cuDevicePrimaryCtxRelease_v2");
    if (!stub_initialized) LEAVE(CUDA_ERROR_NOT_INITIALIZED);
    if (device < 0 || device >= stub_devices) LEAVE(CUDA_ERROR_INVALID_DEVICE);
    if (stub_dev[device].ctx_refs == 0) {
        stub_bad_handles++;
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    }
    stub_dev[device].ctx_refs--;
    LEAVE(CUDA_SUCCESS);
}

STUB_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    ENTER("cuCtxSetCurrent");
    if (!stub_initialized) LEAVE(CUDA_ERROR_NOT_INITIALIZED);
    if (ctx == NULL) {
        stub_current = -1;
        LEAVE(CUDA_SUCCESS);
    }
    long d = stub_index(ctx, STUB_CONTEXT_BASE, (size_t)stub_devices);
    if (d < 0 || stub_dev[d].ctx_refs == 0) {
        stub_bad_handles++;
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    }
    stub_current = (int)d;
    LEAVE(CUDA_SUCCESS);
}

STUB_EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx) {
    ENTER("cuCtxGetCurrent");
    if (!stub_initialized) LEAVE(CUDA_ERROR_NOT_INITIALIZED);
    if (!ctx) LEAVE(CUDA_ERROR_INVALID_VALUE);
    *ctx = stub_current < 0 ? NULL : stub_handle(STUB_CONTEXT_BASE, (size_t)stub_current);
    LEAVE(CUDA_SUCCESS);
}

STUB_EXPORT CUresult cuCtxSynchronize(void) {
    return cu(stub_op_device_sync("cuCtxSynchronize"));
}

STUB_EXPORT CUresult cuStreamCreate(CUstream *stream, unsigned flags) {
    /* CU_STREAM_NON_BLOCKING = 1 */
    return cu(stub_op_stream_create("cuStreamCreate", stream, flags));
}

STUB_EXPORT CUresult cuStreamDestroy_v2(CUstream stream) {
    return cu(stub_op_stream_destroy("cuStreamDestroy_v2", stream));
}

STUB_EXPORT CUresult cuStreamSynchronize(CUstream stream) {
    return cu(stub_op_stream_sync("cuStreamSynchronize", stream));
}

STUB_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size) {
    uint64_t addr = 0;
    stub_status s = stub_op_malloc("cuMemAlloc_v2", ptr ? &addr : NULL, size, 0);
    if (s == ST_OK) *ptr = addr;
    return cu(s);
}

STUB_EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr) {
    return cu(stub_op_free("cuMemFree_v2", ptr, 0));
}

STUB_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    return cu(stub_op_mem_info("cuMemGetInfo_v2", free_bytes, total));
}

STUB_EXPORT CUresult cuMemsetD8Async(CUdeviceptr ptr, unsigned char value, size_t n, CUstream stream) {
    (void)value;
    return cu(stub_op_memset("cuMemsetD8Async", ptr, n, stream));
}

STUB_EXPORT CUresult cuEventCreate(CUevent *event, unsigned flags) {
    (void)flags;
    return cu(stub_op_event_create("cuEventCreate", event));
}

STUB_EXPORT CUresult cuEventRecord(CUevent event, CUstream stream) {
    return cu(stub_op_event_record("cuEventRecord", event, stream));
}

STUB_EXPORT CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    return cu(stub_op_stream_wait("cuStreamWaitEvent", stream, event));
}

STUB_EXPORT CUresult cuEventQuery(CUevent event) {
    return cu(stub_op_event("cuEventQuery", event, STUB_EVENT_QUERY));
}

STUB_EXPORT CUresult cuEventSynchronize(CUevent event) {
    return cu(stub_op_event("cuEventSynchronize", event, STUB_EVENT_SYNCHRONIZE));
}

STUB_EXPORT CUresult cuEventDestroy_v2(CUevent event) {
    return cu(stub_op_event("cuEventDestroy_v2", event, STUB_EVENT_DESTROY));
}

/* ------------------------------------------------ stream capture, graphs */

typedef void *CUgraph;
typedef void *CUgraphExec;

STUB_EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, int mode) {
    return cu(stub_op_begin_capture("cuStreamBeginCapture_v2", stream, mode));
}

STUB_EXPORT CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph) {
    return cu(stub_op_end_capture("cuStreamEndCapture", stream, graph));
}

STUB_EXPORT CUresult cuStreamIsCapturing(CUstream stream, int *status) {
    return cu(stub_op_is_capturing("cuStreamIsCapturing", stream, status));
}

STUB_EXPORT CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
    return cu(stub_op_exchange_mode("cuThreadExchangeStreamCaptureMode", mode));
}

STUB_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    return cu(stub_op_graph_instantiate("cuGraphInstantiateWithFlags", exec, graph));
}

STUB_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
    return cu(stub_op_graph_launch("cuGraphLaunch", exec, stream));
}

STUB_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec) {
    return cu(stub_op_graph_destroy("cuGraphExecDestroy", exec, 1));
}

STUB_EXPORT CUresult cuGraphDestroy(CUgraph graph) {
    return cu(stub_op_graph_destroy("cuGraphDestroy", graph, 0));
}

typedef void *CUgraphNode;
typedef uint64_t cuuint64_t;

/* The stream's capture: status (CUstreamCaptureStatus), id, graph, and its
 * terminal nodes (valid until the next call on the stream). */
STUB_EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream stream, int *status, cuuint64_t *id, CUgraph *graph,
                                               const CUgraphNode **deps, size_t *num) {
    return cu(stub_op_capture_info("cuStreamGetCaptureInfo_v2", stream, status, id, graph, deps, num));
}

STUB_EXPORT CUresult cuGraphNodeGetDependencies(CUgraphNode node, CUgraphNode *deps, size_t *num) {
    return cu(stub_op_node_deps("cuGraphNodeGetDependencies", node, deps, num));
}

/* ------------------------------------------------ virtual memory (VMM) */

typedef unsigned long long CUmemGenericAllocationHandle;
/* CUmemAllocationProp and CUmemAccessDesc, as far as the stub reads them. */
typedef struct {
    int type;
    int id;
} CUmemLocation;
typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} CUmemAllocationProp;
typedef struct {
    CUmemLocation location;
    int flags;
} CUmemAccessDesc;

STUB_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
    return cu(stub_op_total_mem("cuDeviceTotalMem_v2", bytes, device));
}

STUB_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                                   int option) {
    (void)option;
    return cu(stub_op_granularity("cuMemGetAllocationGranularity", granularity, prop,
                                  prop ? prop->location.id : -1));
}

STUB_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                         unsigned long long flags) {
    (void)alignment;
    (void)addr;
    (void)flags;
    uint64_t out = 0;
    stub_status s = stub_op_reserve("cuMemAddressReserve", ptr ? &out : NULL, size);
    if (s == ST_OK) *ptr = out;
    return cu(s);
}

STUB_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    return cu(stub_op_address_free("cuMemAddressFree", ptr, size));
}

STUB_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                 const CUmemAllocationProp *prop, unsigned long long flags) {
    (void)flags;
    void *h = NULL;
    if (!prop) return CUDA_ERROR_INVALID_VALUE;
    stub_status s = stub_op_mem_create("cuMemCreate", handle ? &h : NULL, size, prop->location.id,
                                       prop->requestedHandleTypes);
    if (s == ST_OK) *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return cu(s);
}

/* POSIX file descriptors only (handle type 1): the stub has no fabric. */
STUB_EXPORT CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle,
                                                  int type, unsigned long long flags) {
    return cu(stub_op_mem_export("cuMemExportToShareableHandle", (int *)shareable,
                                 (void *)(uintptr_t)handle, type, flags));
}

STUB_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os,
                                                    int type) {
    void *h = NULL;
    stub_status s = stub_op_mem_import("cuMemImportFromShareableHandle", handle ? &h : NULL,
                                       (int)(uintptr_t)os, type);
    if (s == ST_OK) *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return cu(s);
}

STUB_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    return cu(stub_op_mem_release("cuMemRelease", (void *)(uintptr_t)handle));
}

STUB_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                              unsigned long long flags) {
    (void)flags;
    return cu(stub_op_mem_map("cuMemMap", ptr, size, offset, (void *)(uintptr_t)handle));
}

STUB_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    return cu(stub_op_set_access("cuMemSetAccess", ptr, size, desc, count));
}

STUB_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    return cu(stub_op_mem_unmap("cuMemUnmap", ptr, size));
}

/* ------------------------------------------ IPC, peer access, copies */

typedef struct {
    unsigned char reserved[64];
} CUipcMemHandle;
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 1

STUB_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr ptr) {
    return cu(stub_op_ipc_get("cuIpcGetMemHandle", handle ? handle->reserved : NULL, ptr));
}

STUB_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *ptr, CUipcMemHandle handle, unsigned flags) {
    if (flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) return CUDA_ERROR_INVALID_VALUE;
    uint64_t out = 0;
    stub_status s = stub_op_ipc_open("cuIpcOpenMemHandle_v2", ptr ? &out : NULL, handle.reserved);
    if (s == ST_OK) *ptr = out;
    return cu(s);
}

STUB_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr ptr) {
    return cu(stub_op_ipc_close("cuIpcCloseMemHandle", ptr));
}

/* The device of a retained primary context, or -1. */
static int stub_context_device(CUcontext ctx) {
    pthread_mutex_lock(&stub_lock);
    long d = stub_index(ctx, STUB_CONTEXT_BASE, (size_t)stub_devices);
    int r = d >= 0 && stub_dev[d].ctx_refs > 0 ? (int)d : -1;
    pthread_mutex_unlock(&stub_lock);
    return r;
}

STUB_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    int d = stub_context_device(peer);
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    return cu(stub_op_peer_enable("cuCtxEnablePeerAccess", d));
}

STUB_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
    return cu(stub_op_memcpy("cuMemcpyAsync", dst, src, n, stream, -1, -1));
}

STUB_EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                                       size_t n, CUstream stream) {
    int dd = stub_context_device(dst_ctx), sd = stub_context_device(src_ctx);
    if (dd < 0 || sd < 0) return CUDA_ERROR_INVALID_CONTEXT;
    return cu(stub_op_memcpy("cuMemcpyPeerAsync", dst, src, n, stream, dd, sd));
}

static const char *stub_cu_name(CUresult e) {
    switch (e) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_NOT_READY: return "CUDA_ERROR_NOT_READY";
    case CUDA_ERROR_MAP_FAILED: return "CUDA_ERROR_MAP_FAILED";
    case CUDA_ERROR_ALREADY_MAPPED: return "CUDA_ERROR_ALREADY_MAPPED";
    case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: return "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED";
    case CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: return "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED";
    case CUDA_ERROR_ILLEGAL_STATE: return "CUDA_ERROR_ILLEGAL_STATE";
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED";
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: return "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED";
    case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED: return "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED";
    case CUDA_ERROR_STREAM_CAPTURE_UNJOINED: return "CUDA_ERROR_STREAM_CAPTURE_UNJOINED";
    case CUDA_ERROR_STREAM_CAPTURE_ISOLATION: return "CUDA_ERROR_STREAM_CAPTURE_ISOLATION";
    case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: return "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT";
    case CUDA_ERROR_CAPTURED_EVENT: return "CUDA_ERROR_CAPTURED_EVENT";
    case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: return "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD";
    case CUDA_ERROR_UNKNOWN: return "CUDA_ERROR_UNKNOWN";
    default: return NULL;
    }
}

STUB_EXPORT CUresult cuGetErrorName(CUresult error, const char **name) {
    ENTER("cuGetErrorName");
    const char *n = stub_cu_name(error);
    if (!name || !n) LEAVE(CUDA_ERROR_INVALID_VALUE);
    *name = n;
    LEAVE(CUDA_SUCCESS);
}

STUB_EXPORT CUresult cuGetErrorString(CUresult error, const char **text) {
    ENTER("cuGetErrorString");
    const char *n = stub_cu_name(error);
    if (!text || !n) LEAVE(CUDA_ERROR_INVALID_VALUE);
    *text = n; /* the stub's strings are the names */
    LEAVE(CUDA_SUCCESS);
}
