/*
 * A stub of the HIP runtime (libamdhip64.so.5, symbol version hip_4.2) for
 * testing cachealloc-hip's FFI without a GPU: every entry point the backend
 * and its tests link (the binaries bind every symbol at start), over the
 * state machine of stub_core.h. Error codes are HIP's (hipError_t), and only
 * ones hip-sys's enum lists. A thread's device is 0 until it sets one.
 */
#define STUB_IMPLICIT_DEVICE 1
#include "stub_core.h"

typedef int hipError_t;
typedef void *hipStream_t;
typedef void *hipEvent_t;

enum {
    hipSuccess = 0,
    hipErrorInvalidValue = 1,
    hipErrorOutOfMemory = 2,
    hipErrorNotInitialized = 3,
    hipErrorNoDevice = 100,
    hipErrorInvalidDevice = 101,
    hipErrorInvalidContext = 201,
    hipErrorMapFailed = 205,
    hipErrorAlreadyMapped = 208,
    hipErrorPeerAccessUnsupported = 217,
    hipErrorInvalidHandle = 400,
    hipErrorIllegalState = 401,
    hipErrorNotReady = 600,
    hipErrorPeerAccessAlreadyEnabled = 704,
    hipErrorStreamCaptureUnsupported = 900,
    hipErrorStreamCaptureInvalidated = 901,
    hipErrorStreamCaptureUnmatched = 903,
    hipErrorStreamCaptureUnjoined = 904,
    hipErrorStreamCaptureIsolation = 905,
    hipErrorStreamCaptureImplicit = 906,
    hipErrorCapturedEvent = 907,
    hipErrorStreamCaptureWrongThread = 908,
    hipErrorUnknown = 999,
};

/* The runtime's code for what an entry point found. */
static hipError_t hip(stub_status s) {
    switch (s) {
    case ST_OK: return hipSuccess;
    case ST_INJECTED: return stub_injected_code;
    case ST_INVALID_VALUE: return hipErrorInvalidValue;
    case ST_OUT_OF_MEMORY: return hipErrorOutOfMemory;
    case ST_NOT_INITIALIZED: return hipErrorNotInitialized;
    case ST_NO_DEVICE: return hipErrorNoDevice;
    case ST_INVALID_DEVICE: return hipErrorInvalidDevice;
    case ST_INVALID_CONTEXT: return hipErrorInvalidContext;
    case ST_BAD_HANDLE: return hipErrorInvalidHandle;
    case ST_NOT_READY: return hipErrorNotReady;
    case ST_MAP_FAILED: return hipErrorMapFailed;
    case ST_ALREADY_MAPPED: return hipErrorAlreadyMapped;
    case ST_PEER_UNSUPPORTED: return hipErrorPeerAccessUnsupported;
    case ST_PEER_ALREADY_ENABLED: return hipErrorPeerAccessAlreadyEnabled;
    case ST_ILLEGAL_STATE: return hipErrorIllegalState;
    case ST_CAPTURE_UNSUPPORTED: return hipErrorStreamCaptureUnsupported;
    case ST_CAPTURE_INVALIDATED: return hipErrorStreamCaptureInvalidated;
    case ST_CAPTURE_UNMATCHED: return hipErrorStreamCaptureUnmatched;
    case ST_CAPTURE_UNJOINED: return hipErrorStreamCaptureUnjoined;
    case ST_CAPTURE_ISOLATION: return hipErrorStreamCaptureIsolation;
    case ST_CAPTURE_IMPLICIT: return hipErrorStreamCaptureImplicit;
    case ST_CAPTURED_EVENT: return hipErrorCapturedEvent;
    case ST_CAPTURE_WRONG_THREAD: return hipErrorStreamCaptureWrongThread;
    }
    return hipErrorUnknown;
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
        hipError_t r_ = (code);                                                \
        pthread_mutex_unlock(&stub_lock);                                      \
        return r_;                                                             \
    } while (0)
/* The calling thread's device, or return "no device". */
#define NEED_DEVICE(dev)                                                       \
    if (stub_devices == 0) LEAVE(hipErrorNoDevice);                            \
    int dev = stub_current < 0 ? 0 : stub_current

STUB_EXPORT hipError_t hipGetDeviceCount(int *count) {
    ENTER("hipGetDeviceCount");
    if (!count) LEAVE(hipErrorInvalidValue);
    *count = stub_devices;
    LEAVE(stub_devices == 0 ? hipErrorNoDevice : hipSuccess);
}

STUB_EXPORT hipError_t hipSetDevice(int device) {
    ENTER("hipSetDevice");
    if (stub_devices == 0) LEAVE(hipErrorNoDevice);
    if (device < 0 || device >= stub_devices) LEAVE(hipErrorInvalidDevice);
    stub_current = device;
    LEAVE(hipSuccess);
}

STUB_EXPORT hipError_t hipGetDevice(int *device) {
    ENTER("hipGetDevice");
    NEED_DEVICE(dev);
    if (!device) LEAVE(hipErrorInvalidValue);
    *device = dev;
    LEAVE(hipSuccess);
}

STUB_EXPORT hipError_t hipDeviceSynchronize(void) {
    return hip(stub_op_device_sync("hipDeviceSynchronize"));
}

STUB_EXPORT hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned flags) {
    /* hipStreamNonBlocking = 1 */
    return hip(stub_op_stream_create("hipStreamCreateWithFlags", stream, flags));
}

STUB_EXPORT hipError_t hipStreamDestroy(hipStream_t stream) {
    return hip(stub_op_stream_destroy("hipStreamDestroy", stream));
}

STUB_EXPORT hipError_t hipStreamSynchronize(hipStream_t stream) {
    return hip(stub_op_stream_sync("hipStreamSynchronize", stream));
}

STUB_EXPORT hipError_t hipMalloc(void **ptr, size_t size) {
    uint64_t addr = 0;
    stub_status s = stub_op_malloc("hipMalloc", ptr ? &addr : NULL, size, 1);
    if (s == ST_OK) *ptr = (void *)(uintptr_t)addr;
    return hip(s);
}

STUB_EXPORT hipError_t hipFree(void *ptr) {
    return hip(stub_op_free("hipFree", (uint64_t)(uintptr_t)ptr, 1));
}

STUB_EXPORT hipError_t hipMemGetInfo(size_t *free_bytes, size_t *total) {
    return hip(stub_op_mem_info("hipMemGetInfo", free_bytes, total));
}

STUB_EXPORT hipError_t hipMemsetAsync(void *dst, int value, size_t n, hipStream_t stream) {
    (void)value;
    return hip(stub_op_memset("hipMemsetAsync", (uint64_t)(uintptr_t)dst, n, stream));
}

STUB_EXPORT hipError_t hipEventCreateWithFlags(hipEvent_t *event, unsigned flags) {
    (void)flags;
    return hip(stub_op_event_create("hipEventCreateWithFlags", event));
}

STUB_EXPORT hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream) {
    return hip(stub_op_event_record("hipEventRecord", event, stream));
}

STUB_EXPORT hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned flags) {
    if (flags != 0) return hipErrorInvalidValue;
    return hip(stub_op_stream_wait("hipStreamWaitEvent", stream, event));
}

STUB_EXPORT hipError_t hipEventQuery(hipEvent_t event) {
    return hip(stub_op_event("hipEventQuery", event, STUB_EVENT_QUERY));
}

STUB_EXPORT hipError_t hipEventSynchronize(hipEvent_t event) {
    return hip(stub_op_event("hipEventSynchronize", event, STUB_EVENT_SYNCHRONIZE));
}

STUB_EXPORT hipError_t hipEventDestroy(hipEvent_t event) {
    return hip(stub_op_event("hipEventDestroy", event, STUB_EVENT_DESTROY));
}

/* ------------------------------------------------ stream capture, graphs */

typedef void *hipGraph_t;
typedef void *hipGraphExec_t;
typedef void *hipGraphNode_t;

STUB_EXPORT hipError_t hipStreamBeginCapture(hipStream_t stream, int mode) {
    return hip(stub_op_begin_capture("hipStreamBeginCapture", stream, mode));
}

STUB_EXPORT hipError_t hipStreamEndCapture(hipStream_t stream, hipGraph_t *graph) {
    return hip(stub_op_end_capture("hipStreamEndCapture", stream, graph));
}

STUB_EXPORT hipError_t hipStreamIsCapturing(hipStream_t stream, int *status) {
    return hip(stub_op_is_capturing("hipStreamIsCapturing", stream, status));
}

STUB_EXPORT hipError_t hipThreadExchangeStreamCaptureMode(int *mode) {
    return hip(stub_op_exchange_mode("hipThreadExchangeStreamCaptureMode", mode));
}

STUB_EXPORT hipError_t hipGraphInstantiate(hipGraphExec_t *exec, hipGraph_t graph, hipGraphNode_t *error_node,
                                           char *log, size_t log_size) {
    (void)error_node;
    (void)log;
    (void)log_size;
    return hip(stub_op_graph_instantiate("hipGraphInstantiate", exec, graph));
}

STUB_EXPORT hipError_t hipGraphLaunch(hipGraphExec_t exec, hipStream_t stream) {
    return hip(stub_op_graph_launch("hipGraphLaunch", exec, stream));
}

STUB_EXPORT hipError_t hipGraphExecDestroy(hipGraphExec_t exec) {
    return hip(stub_op_graph_destroy("hipGraphExecDestroy", exec, 1));
}

STUB_EXPORT hipError_t hipGraphDestroy(hipGraph_t graph) {
    return hip(stub_op_graph_destroy("hipGraphDestroy", graph, 0));
}

/* The stream's capture: status (hipStreamCaptureStatus), id, graph, and
 * its terminal nodes (valid until the next call on the stream). */
STUB_EXPORT hipError_t hipStreamGetCaptureInfo_v2(hipStream_t stream, int *status, unsigned long long *id,
                                                  hipGraph_t *graph, const hipGraphNode_t **deps, size_t *num) {
    uint64_t capture = 0;
    stub_status s = stub_op_capture_info("hipStreamGetCaptureInfo_v2", stream, status, id ? &capture : NULL,
                                         graph, deps, num);
    if (s == ST_OK && id) *id = capture;
    return hip(s);
}

STUB_EXPORT hipError_t hipGraphNodeGetDependencies(hipGraphNode_t node, hipGraphNode_t *deps, size_t *num) {
    return hip(stub_op_node_deps("hipGraphNodeGetDependencies", node, deps, num));
}

/* ------------------------------------------------ virtual memory (VMM) */

typedef void *hipMemGenericAllocationHandle_t;
/* hipMemAllocationProp and hipMemAccessDesc, as far as the stub reads them. */
typedef struct {
    int type;
    int id;
} hipMemLocation;
typedef struct {
    int type;
    int requestedHandleType;
    hipMemLocation location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} hipMemAllocationProp;
typedef struct {
    hipMemLocation location;
    int flags;
} hipMemAccessDesc;

STUB_EXPORT hipError_t hipDeviceTotalMem(size_t *bytes, int device) {
    return hip(stub_op_total_mem("hipDeviceTotalMem", bytes, device));
}

STUB_EXPORT hipError_t hipMemGetAllocationGranularity(size_t *granularity, const hipMemAllocationProp *prop,
                                                      int option) {
    (void)option;
    return hip(stub_op_granularity("hipMemGetAllocationGranularity", granularity, prop,
                                   prop ? prop->location.id : -1));
}

STUB_EXPORT hipError_t hipMemAddressReserve(void **ptr, size_t size, size_t alignment, void *addr,
                                            unsigned long long flags) {
    (void)alignment;
    (void)addr;
    (void)flags;
    uint64_t out = 0;
    stub_status s = stub_op_reserve("hipMemAddressReserve", ptr ? &out : NULL, size);
    if (s == ST_OK) *ptr = (void *)(uintptr_t)out;
    return hip(s);
}

STUB_EXPORT hipError_t hipMemAddressFree(void *ptr, size_t size) {
    return hip(stub_op_address_free("hipMemAddressFree", (uint64_t)(uintptr_t)ptr, size));
}

STUB_EXPORT hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *handle, size_t size,
                                    const hipMemAllocationProp *prop, unsigned long long flags) {
    (void)flags;
    if (!prop) return hipErrorInvalidValue;
    return hip(stub_op_mem_create("hipMemCreate", handle, size, prop->location.id, prop->requestedHandleType));
}

/* POSIX file descriptors only (hipMemHandleTypePosixFileDescriptor). */
STUB_EXPORT hipError_t hipMemExportToShareableHandle(void *shareable, hipMemGenericAllocationHandle_t handle,
                                                     int type, unsigned long long flags) {
    return hip(stub_op_mem_export("hipMemExportToShareableHandle", (int *)shareable, handle, type, flags));
}

/* The HIP version the stub reports (hipRuntimeGetVersion), and so how
 * hipMemImportFromShareableHandle reads its handle: from ROCm 7.1 the file
 * descriptor itself in the pointer's bits, before it a pointer to it
 * (torch's ROCM_VERSION >= 70100 split; ROCm/rocm-systems#1564). */
static int stub_hip_version = -1;

/* The version: set by cachealloc_stub_set_hip_version, else
 * CACHEALLOC_STUB_HIP_VERSION (for a process another test starts), else
 * ROCm 7.2's. Called with the lock held. */
static int stub_hip_version_locked(void) {
    if (stub_hip_version < 0) {
        const char *v = getenv("CACHEALLOC_STUB_HIP_VERSION");
        stub_hip_version = v && *v ? atoi(v) : 70200000;
    }
    return stub_hip_version;
}

/* Act as the runtime of another ROCm release (HIP_VERSION encoding). */
STUB_EXPORT void cachealloc_stub_set_hip_version(int version) {
    pthread_mutex_lock(&stub_lock);
    stub_hip_version = version;
    pthread_mutex_unlock(&stub_lock);
}

STUB_EXPORT hipError_t hipRuntimeGetVersion(int *version) {
    if (!version) return hipErrorInvalidValue;
    pthread_mutex_lock(&stub_lock);
    *version = stub_hip_version_locked();
    pthread_mutex_unlock(&stub_lock);
    return hipSuccess;
}

STUB_EXPORT hipError_t hipMemImportFromShareableHandle(hipMemGenericAllocationHandle_t *handle, void *os,
                                                       int type) {
    pthread_mutex_lock(&stub_lock);
    int by_value = stub_hip_version_locked() >= 70100000;
    pthread_mutex_unlock(&stub_lock);
    if (!os) return hipErrorInvalidValue;
    /* An old runtime dereferences the pointer: a descriptor's value there
     * (a small number) is no address, and it fails as a bad handle. */
    if (!by_value && (uintptr_t)os < 4096) return hipErrorInvalidValue;
    int fd = by_value ? (int)(uintptr_t)os : *(const int *)os;
    return hip(stub_op_mem_import("hipMemImportFromShareableHandle", handle, fd, type));
}

STUB_EXPORT hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle) {
    return hip(stub_op_mem_release("hipMemRelease", handle));
}

STUB_EXPORT hipError_t hipMemMap(void *ptr, size_t size, size_t offset, hipMemGenericAllocationHandle_t handle,
                                 unsigned long long flags) {
    (void)flags;
    return hip(stub_op_mem_map("hipMemMap", (uint64_t)(uintptr_t)ptr, size, offset, handle));
}

STUB_EXPORT hipError_t hipMemSetAccess(void *ptr, size_t size, const hipMemAccessDesc *desc, size_t count) {
    return hip(stub_op_set_access("hipMemSetAccess", (uint64_t)(uintptr_t)ptr, size, desc, count));
}

STUB_EXPORT hipError_t hipMemUnmap(void *ptr, size_t size) {
    return hip(stub_op_mem_unmap("hipMemUnmap", (uint64_t)(uintptr_t)ptr, size));
}

/* ------------------------------------------ IPC, peer access, copies */

typedef struct {
    unsigned char reserved[64];
} hipIpcMemHandle_t;
#define hipMemcpyDeviceToDevice 3
#define hipMemcpyDefault 4

STUB_EXPORT hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t *handle, void *ptr) {
    return hip(stub_op_ipc_get("hipIpcGetMemHandle", handle ? handle->reserved : NULL, (uint64_t)(uintptr_t)ptr));
}

/* The flags hipIpcOpenMemHandle accepts: hipIpcMemLazyEnablePeerAccess,
 * which ROCm 5's header (and hip-sys) define as 0 and ROCm 6's as 1; the
 * runtime refuses any other value with hipErrorInvalidValue. */
static unsigned stub_ipc_open_flag = 0;

/* Act as the runtime of another ROCm: accept `flag` only. */
STUB_EXPORT void cachealloc_stub_set_ipc_open_flag(unsigned flag) {
    pthread_mutex_lock(&stub_lock);
    stub_ipc_open_flag = flag;
    pthread_mutex_unlock(&stub_lock);
}

STUB_EXPORT hipError_t hipIpcOpenMemHandle(void **ptr, hipIpcMemHandle_t handle, unsigned flags) {
    pthread_mutex_lock(&stub_lock);
    unsigned wanted = stub_ipc_open_flag;
    pthread_mutex_unlock(&stub_lock);
    if (flags != wanted) return hipErrorInvalidValue;
    uint64_t out = 0;
    stub_status s = stub_op_ipc_open("hipIpcOpenMemHandle", ptr ? &out : NULL, handle.reserved);
    if (s == ST_OK) *ptr = (void *)(uintptr_t)out;
    return hip(s);
}

STUB_EXPORT hipError_t hipIpcCloseMemHandle(void *ptr) {
    return hip(stub_op_ipc_close("hipIpcCloseMemHandle", (uint64_t)(uintptr_t)ptr));
}

STUB_EXPORT hipError_t hipDeviceEnablePeerAccess(int peer, unsigned flags) {
    if (flags != 0) return hipErrorInvalidValue;
    return hip(stub_op_peer_enable("hipDeviceEnablePeerAccess", peer));
}

/* The stub keeps no sticky error: the last error is always success. */
STUB_EXPORT hipError_t hipGetLastError(void) {
    return hipSuccess;
}

STUB_EXPORT hipError_t hipMemcpyAsync(void *dst, const void *src, size_t n, int kind, hipStream_t stream) {
    if (kind != hipMemcpyDeviceToDevice && kind != hipMemcpyDefault) return hipErrorInvalidValue;
    return hip(stub_op_memcpy("hipMemcpyAsync", (uint64_t)(uintptr_t)dst, (uint64_t)(uintptr_t)src, n, stream,
                              -1, -1));
}

STUB_EXPORT hipError_t hipMemcpyPeerAsync(void *dst, int dst_dev, const void *src, int src_dev, size_t n,
                                          hipStream_t stream) {
    if (dst_dev < 0 || src_dev < 0) return hipErrorInvalidDevice;
    return hip(stub_op_memcpy("hipMemcpyPeerAsync", (uint64_t)(uintptr_t)dst, (uint64_t)(uintptr_t)src, n,
                              stream, dst_dev, src_dev));
}

STUB_EXPORT const char *hipGetErrorName(hipError_t error) {
    switch (error) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
    case hipErrorNotInitialized: return "hipErrorNotInitialized";
    case hipErrorNoDevice: return "hipErrorNoDevice";
    case hipErrorInvalidDevice: return "hipErrorInvalidDevice";
    case hipErrorInvalidContext: return "hipErrorInvalidContext";
    case hipErrorInvalidHandle: return "hipErrorInvalidHandle";
    case hipErrorNotReady: return "hipErrorNotReady";
    case hipErrorMapFailed: return "hipErrorMapFailed";
    case hipErrorAlreadyMapped: return "hipErrorAlreadyMapped";
    case hipErrorPeerAccessUnsupported: return "hipErrorPeerAccessUnsupported";
    case hipErrorPeerAccessAlreadyEnabled: return "hipErrorPeerAccessAlreadyEnabled";
    case hipErrorIllegalState: return "hipErrorIllegalState";
    case hipErrorStreamCaptureUnsupported: return "hipErrorStreamCaptureUnsupported";
    case hipErrorStreamCaptureInvalidated: return "hipErrorStreamCaptureInvalidated";
    case hipErrorStreamCaptureUnmatched: return "hipErrorStreamCaptureUnmatched";
    case hipErrorStreamCaptureUnjoined: return "hipErrorStreamCaptureUnjoined";
    case hipErrorStreamCaptureIsolation: return "hipErrorStreamCaptureIsolation";
    case hipErrorStreamCaptureImplicit: return "hipErrorStreamCaptureImplicit";
    case hipErrorCapturedEvent: return "hipErrorCapturedEvent";
    case hipErrorStreamCaptureWrongThread: return "hipErrorStreamCaptureWrongThread";
    case hipErrorUnknown: return "hipErrorUnknown";
    default: return "hipErrorUnknown";
    }
}

STUB_EXPORT const char *hipGetErrorString(hipError_t error) {
    return hipGetErrorName(error);
}
