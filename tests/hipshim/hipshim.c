/*
 * hipshim: the HIP runtime and hiprtc entry points rocmforge loads (src/runtime/hip.rs,
 * src/runtime/hiprtc.rs), implemented over the CUDA driver API and NVRTC, both dlopen'ed.
 *
 * WHAT THIS CHECKS, AND WHAT IT DOES NOT. No AMD GPU is available to the project, so the GPU
 * suite builds this file with the system C compiler and runs rocmforge's HIP device path
 * (`hip:0`) through it on an NVIDIA GPU: library loading, every entry point and its argument
 * marshalling, streams, stream-ordered memory, events, stream callbacks, modules, launches and
 * graph capture/replay. It is HIP's own NVIDIA platform (a HIP device whose architecture is an
 * NVIDIA one, `sm_90`), which upstream ships as inline headers over the CUDA runtime, not as a
 * library, so this small library stands in for it. It says nothing about AMD hardware, the AMD
 * ISA, comgr, libamdhip64's behaviour or hiprtc's AMD code generation.
 *
 * Plain C without CUDA or HIP headers: the few driver and NVRTC prototypes, types and constants
 * used are declared here. HIP's error, flag, stream-capture-mode and (CUDA-compatible) device
 * attribute values equal CUDA's where they are passed through; where they differ they are
 * translated (device attributes, below).
 *
 * Build: cc -shared -fPIC -O2 -o libhipshim.so hipshim.c -ldl -lpthread
 * One library serves both roles: ROCMFORGE_HIP_LIBRARY and ROCMFORGE_HIPRTC may name it (or
 * rocmforge's `HipLibraries` paths). It reports no AMD ROCm version and brings no comgr into the
 * process, which is how rocmforge tells it from AMD's hiprtc.
 */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- CUDA driver API: the types and prototypes used (cuda.h) ---- */

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef unsigned long long CUdeviceptr;
typedef void (*CUstreamCallback)(CUstream, CUresult, void *);
typedef void (*CUhostFn)(void *);

/* CUdevice_attribute values (cuda.h). */
enum {
    CU_ATTR_MAX_THREADS_PER_BLOCK = 1,
    CU_ATTR_MAX_BLOCK_DIM_X = 2,
    CU_ATTR_MAX_BLOCK_DIM_Y = 3,
    CU_ATTR_MAX_BLOCK_DIM_Z = 4,
    CU_ATTR_MAX_GRID_DIM_X = 5,
    CU_ATTR_MAX_GRID_DIM_Y = 6,
    CU_ATTR_MAX_GRID_DIM_Z = 7,
    CU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK = 8,
    CU_ATTR_WARP_SIZE = 10,
    CU_ATTR_CLOCK_RATE = 13,
    CU_ATTR_MULTIPROCESSOR_COUNT = 16,
    CU_ATTR_L2_CACHE_SIZE = 38,
    CU_ATTR_MAX_THREADS_PER_MULTIPROCESSOR = 39,
    CU_ATTR_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_ATTR_COMPUTE_CAPABILITY_MINOR = 76,
    CU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
};

/* ---- HIP values (hip_runtime_api.h, hiprtc.h) ---- */

typedef int hipError_t;
enum {
    hipSuccess = 0,
    hipErrorInvalidValue = 1,
    hipErrorNotInitialized = 3,
    hipErrorNoDevice = 100,
    hipErrorInvalidDevice = 101,
    hipErrorNotSupported = 801,
};

typedef int hiprtcResult;
enum {
    HIPRTC_SUCCESS = 0,
    HIPRTC_ERROR_OUT_OF_MEMORY = 1,
    HIPRTC_ERROR_PROGRAM_CREATION_FAILURE = 2,
    HIPRTC_ERROR_INVALID_INPUT = 3,
    HIPRTC_ERROR_INVALID_PROGRAM = 4,
    HIPRTC_ERROR_INVALID_OPTION = 5,
    HIPRTC_ERROR_COMPILATION = 6,
    HIPRTC_ERROR_INTERNAL_ERROR = 11,
};

/* hipDeviceAttribute_t, the CUDA-compatible block, mapped to CUdevice_attribute. */
static const int ATTRIBUTES[][2] = {
    {5, CU_ATTR_CLOCK_RATE},
    {19, CU_ATTR_L2_CACHE_SIZE},
    {23, CU_ATTR_COMPUTE_CAPABILITY_MAJOR},
    {26, CU_ATTR_MAX_BLOCK_DIM_X},
    {27, CU_ATTR_MAX_BLOCK_DIM_Y},
    {28, CU_ATTR_MAX_BLOCK_DIM_Z},
    {29, CU_ATTR_MAX_GRID_DIM_X},
    {30, CU_ATTR_MAX_GRID_DIM_Y},
    {31, CU_ATTR_MAX_GRID_DIM_Z},
    {56, CU_ATTR_MAX_THREADS_PER_BLOCK},
    {57, CU_ATTR_MAX_THREADS_PER_MULTIPROCESSOR},
    {61, CU_ATTR_COMPUTE_CAPABILITY_MINOR},
    {63, CU_ATTR_MULTIPROCESSOR_COUNT},
    {74, CU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK},
    {75, CU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN},
    {87, CU_ATTR_WARP_SIZE},
};

/* hipDeviceProp_tR0600: `name` at 0, `gcnArchName` at 1160, 1472 bytes in all. Only those two
 * are filled (rocmforge reads the architecture name); the rest stays zero. */
#define PROP_SIZE 1472
#define PROP_NAME 0
#define PROP_ARCH 1160

/* ---- the driver, loaded once ---- */

static struct {
    void *lib;
    CUresult init_result; /* cuInit's answer, or hipErrorNoDevice without a driver */
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDriverGetVersion)(int *);
    CUresult (*cuGetErrorString)(CUresult, const char **);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDeviceGetName)(char *, int, CUdevice);
    CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuCtxGetCurrent)(CUcontext *);
    CUresult (*cuStreamCreate)(CUstream *, unsigned);
    CUresult (*cuStreamDestroy)(CUstream);
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuStreamAddCallback)(CUstream, CUstreamCallback, void *, unsigned);
    CUresult (*cuLaunchHostFunc)(CUstream, CUhostFn, void *);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*cuModuleLoadData)(CUmodule *, const void *);
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*cuModuleUnload)(CUmodule);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **);
    CUresult (*cuEventCreate)(CUevent *, unsigned);
    CUresult (*cuEventRecord)(CUevent, CUstream);
    CUresult (*cuEventQuery)(CUevent);
    CUresult (*cuEventSynchronize)(CUevent);
    CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*cuEventDestroy)(CUevent);
    CUresult (*cuStreamBeginCapture)(CUstream, int);
    CUresult (*cuStreamEndCapture)(CUstream, CUgraph *);
    CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
    CUresult (*cuGraphExecDestroy)(CUgraphExec);
    CUresult (*cuGraphDestroy)(CUgraph);
} cu;

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
/* Set when the driver lacks an entry point this file needs: then nothing is used. */
static const char *cu_missing;

/* One primary context per device, retained once; guarded by ctx_lock. */
#define MAX_DEVICES 64
static CUcontext contexts[MAX_DEVICES];
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
/* HIP's current device is per host thread, device 0 until hipSetDevice says otherwise. */
static __thread int current_device;

static void *first_symbol(const char *const *names) {
    for (; *names; names++) {
        void *p = dlsym(cu.lib, *names);
        if (p) return p;
    }
    return NULL;
}

#define NAMES(...) ((const char *const[]){__VA_ARGS__, NULL})
#define RESOLVE(field, ...)                                                          \
    do {                                                                             \
        *(void **)(&cu.field) = first_symbol(NAMES(__VA_ARGS__));                   \
        if (!cu.field && !cu_missing) cu_missing = NAMES(__VA_ARGS__)[0];            \
    } while (0)

static void load_driver(void) {
    cu.init_result = hipErrorNoDevice;
    cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cu.lib) cu.lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!cu.lib) return;
    RESOLVE(cuInit, "cuInit");
    RESOLVE(cuDriverGetVersion, "cuDriverGetVersion");
    RESOLVE(cuGetErrorString, "cuGetErrorString");
    RESOLVE(cuDeviceGetCount, "cuDeviceGetCount");
    RESOLVE(cuDeviceGet, "cuDeviceGet");
    RESOLVE(cuDeviceGetName, "cuDeviceGetName");
    RESOLVE(cuDeviceGetAttribute, "cuDeviceGetAttribute");
    RESOLVE(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    RESOLVE(cuCtxSetCurrent, "cuCtxSetCurrent");
    RESOLVE(cuCtxGetCurrent, "cuCtxGetCurrent");
    RESOLVE(cuStreamCreate, "cuStreamCreate");
    RESOLVE(cuStreamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy");
    RESOLVE(cuStreamSynchronize, "cuStreamSynchronize");
    RESOLVE(cuLaunchHostFunc, "cuLaunchHostFunc");
    RESOLVE(cuMemAlloc, "cuMemAlloc_v2");
    RESOLVE(cuMemFree, "cuMemFree_v2");
    RESOLVE(cuMemAllocAsync, "cuMemAllocAsync");
    RESOLVE(cuMemFreeAsync, "cuMemFreeAsync");
    RESOLVE(cuMemsetD8Async, "cuMemsetD8Async");
    RESOLVE(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    RESOLVE(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
    RESOLVE(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    RESOLVE(cuModuleLoadData, "cuModuleLoadData");
    RESOLVE(cuModuleGetFunction, "cuModuleGetFunction");
    RESOLVE(cuModuleUnload, "cuModuleUnload");
    RESOLVE(cuLaunchKernel, "cuLaunchKernel");
    RESOLVE(cuEventCreate, "cuEventCreate");
    RESOLVE(cuEventRecord, "cuEventRecord");
    RESOLVE(cuEventQuery, "cuEventQuery");
    RESOLVE(cuEventSynchronize, "cuEventSynchronize");
    RESOLVE(cuEventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime");
    RESOLVE(cuEventDestroy, "cuEventDestroy_v2", "cuEventDestroy");
    RESOLVE(cuStreamBeginCapture, "cuStreamBeginCapture_v2");
    RESOLVE(cuStreamEndCapture, "cuStreamEndCapture");
    RESOLVE(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags");
    RESOLVE(cuGraphLaunch, "cuGraphLaunch");
    RESOLVE(cuGraphExecDestroy, "cuGraphExecDestroy");
    RESOLVE(cuGraphDestroy, "cuGraphDestroy");
    /* Optional: the callback is carried by cuLaunchHostFunc where the driver lacks it. */
    *(void **)(&cu.cuStreamAddCallback) = dlsym(cu.lib, "cuStreamAddCallback");
    if (cu_missing) return;
    cu.init_result = cu.cuInit(0);
}

/* The driver, loaded and initialised; hipErrorNoDevice where there is none. */
static hipError_t driver(void) {
    pthread_once(&cu_once, load_driver);
    return cu.init_result;
}

/* The primary context of `device`, retained on first use. */
static hipError_t context_of(int device, CUcontext *out) {
    int count = 0;
    CUresult r = cu.cuDeviceGetCount(&count);
    if (r) return r;
    if (device < 0 || device >= count || device >= MAX_DEVICES) return hipErrorInvalidDevice;
    pthread_mutex_lock(&ctx_lock);
    if (!contexts[device]) {
        CUdevice d;
        r = cu.cuDeviceGet(&d, device);
        if (!r) r = cu.cuDevicePrimaryCtxRetain(&contexts[device], d);
    }
    *out = contexts[device];
    pthread_mutex_unlock(&ctx_lock);
    return r;
}

/* Every call but the version queries runs with the thread's current device bound, as HIP does
 * implicitly: a thread that never called hipSetDevice works on device 0. */
static hipError_t bound(void) {
    hipError_t r = driver();
    if (r) return r;
    CUcontext cur = NULL;
    r = cu.cuCtxGetCurrent(&cur);
    if (r) return r;
    if (cur) return hipSuccess;
    r = context_of(current_device, &cur);
    if (r) return r;
    return cu.cuCtxSetCurrent(cur);
}

#define BOUND()                          \
    do {                                 \
        hipError_t bound_ = bound();     \
        if (bound_) return bound_;       \
    } while (0)

/* ---- HIP runtime ---- */

EXPORT hipError_t hipInit(unsigned flags) {
    if (flags) return hipErrorInvalidValue;
    return driver();
}

EXPORT hipError_t hipGetDeviceCount(int *count) {
    hipError_t r = driver();
    if (r) return r;
    if (!count) return hipErrorInvalidValue;
    return cu.cuDeviceGetCount(count);
}

EXPORT hipError_t hipSetDevice(int device) {
    hipError_t r = driver();
    if (r) return r;
    CUcontext ctx;
    r = context_of(device, &ctx);
    if (r) return r;
    r = cu.cuCtxSetCurrent(ctx);
    if (!r) current_device = device;
    return r;
}

EXPORT hipError_t hipDeviceGetName(char *name, int len, int device) {
    hipError_t r = driver();
    if (r) return r;
    if (!name || len <= 0) return hipErrorInvalidValue;
    CUdevice d;
    r = cu.cuDeviceGet(&d, device);
    return r ? r : cu.cuDeviceGetName(name, len, d);
}

/* The NVIDIA architecture name, `sm_<major><minor>`, as HIP's NVIDIA platform names it. */
static hipError_t arch_name(int device, char *out, size_t len) {
    CUdevice d;
    int major = 0, minor = 0;
    hipError_t r = cu.cuDeviceGet(&d, device);
    if (!r) r = cu.cuDeviceGetAttribute(&major, CU_ATTR_COMPUTE_CAPABILITY_MAJOR, d);
    if (!r) r = cu.cuDeviceGetAttribute(&minor, CU_ATTR_COMPUTE_CAPABILITY_MINOR, d);
    if (!r) snprintf(out, len, "sm_%d%d", major, minor);
    return r;
}

EXPORT hipError_t hipGetDevicePropertiesR0600(void *prop, int device) {
    hipError_t r = driver();
    if (r) return r;
    if (!prop) return hipErrorInvalidValue;
    unsigned char *p = prop;
    memset(p, 0, PROP_SIZE);
    r = hipDeviceGetName((char *)p + PROP_NAME, 256, device);
    if (!r) r = arch_name(device, (char *)p + PROP_ARCH, 256);
    return r;
}

/* The pre-ROCm-6 name: rocmforge takes whichever it finds, reading either layout by content. */
EXPORT hipError_t hipGetDeviceProperties(void *prop, int device) {
    return hipGetDevicePropertiesR0600(prop, device);
}

EXPORT hipError_t hipDeviceGetAttribute(int *value, int attribute, int device) {
    hipError_t r = driver();
    if (r) return r;
    if (!value) return hipErrorInvalidValue;
    for (size_t i = 0; i < sizeof ATTRIBUTES / sizeof ATTRIBUTES[0]; i++) {
        if (ATTRIBUTES[i][0] == attribute) {
            CUdevice d;
            r = cu.cuDeviceGet(&d, device);
            return r ? r : cu.cuDeviceGetAttribute(value, ATTRIBUTES[i][1], d);
        }
    }
    return hipErrorInvalidValue;
}

EXPORT hipError_t hipDriverGetVersion(int *version) {
    pthread_once(&cu_once, load_driver);
    if (!version) return hipErrorInvalidValue;
    if (!cu.cuDriverGetVersion) return hipErrorNoDevice;
    return cu.cuDriverGetVersion(version);
}

/* HIP's NVIDIA platform answers with the CUDA runtime's version; this library has no CUDA
 * runtime, so the driver's CUDA version stands for it (13000 for CUDA 13.0). Not a ROCm
 * version (major * 10^7 + ...), which is how rocmforge's AMD target tables know it is not AMD's. */
EXPORT hipError_t hipRuntimeGetVersion(int *version) {
    return hipDriverGetVersion(version);
}

/* Messages for the codes this file makes itself; the driver's own for everything else (HIP's
 * codes are CUDA's where both have one). */
EXPORT const char *hipGetErrorString(hipError_t code) {
    switch (code) {
    case hipSuccess:
        return "no error";
    case hipErrorNoDevice:
        if (cu_missing) return "hipshim: libcuda lacks an entry point hipshim needs";
        if (!cu.lib) return "hipshim: no CUDA driver (libcuda.so.1) could be loaded";
        break;
    default:
        break;
    }
    const char *s = NULL;
    if (cu.cuGetErrorString && cu.cuGetErrorString(code, &s) == 0 && s) return s;
    return "hipshim: unknown error";
}

/* hipStreamNonBlocking (1) is CU_STREAM_NON_BLOCKING. */
EXPORT hipError_t hipStreamCreateWithFlags(CUstream *stream, unsigned flags) {
    BOUND();
    if (!stream || flags > 1) return hipErrorInvalidValue;
    return cu.cuStreamCreate(stream, flags);
}

EXPORT hipError_t hipStreamDestroy(CUstream stream) {
    BOUND();
    return cu.cuStreamDestroy(stream);
}

EXPORT hipError_t hipStreamSynchronize(CUstream stream) {
    BOUND();
    return cu.cuStreamSynchronize(stream);
}

/* hipStreamCallback_t and CUstreamCallback have the same arguments: stream, status, data. */
typedef void (*hipStreamCallback_t)(CUstream, hipError_t, void *);

struct host_call {
    hipStreamCallback_t fn;
    CUstream stream;
    void *data;
};

static void run_host_call(void *p) {
    struct host_call c = *(struct host_call *)p;
    free(p);
    c.fn(c.stream, hipSuccess, c.data);
}

EXPORT hipError_t hipStreamAddCallback(CUstream stream, hipStreamCallback_t callback,
                                       void *data, unsigned flags) {
    BOUND();
    if (!callback || flags) return hipErrorInvalidValue;
    if (cu.cuStreamAddCallback)
        return cu.cuStreamAddCallback(stream, (CUstreamCallback)callback, data, 0);
    struct host_call *c = malloc(sizeof *c);
    if (!c) return 2; /* hipErrorOutOfMemory */
    *c = (struct host_call){callback, stream, data};
    hipError_t r = cu.cuLaunchHostFunc(stream, run_host_call, c);
    if (r) free(c);
    return r;
}

EXPORT hipError_t hipMalloc(void **ptr, size_t size) {
    BOUND();
    if (!ptr) return hipErrorInvalidValue;
    CUdeviceptr p = 0;
    hipError_t r = cu.cuMemAlloc(&p, size);
    *ptr = r ? NULL : (void *)(uintptr_t)p;
    return r;
}

EXPORT hipError_t hipFree(void *ptr) {
    BOUND();
    return ptr ? cu.cuMemFree((CUdeviceptr)(uintptr_t)ptr) : hipSuccess;
}

EXPORT hipError_t hipMallocAsync(void **ptr, size_t size, CUstream stream) {
    BOUND();
    if (!ptr) return hipErrorInvalidValue;
    CUdeviceptr p = 0;
    hipError_t r = cu.cuMemAllocAsync(&p, size, stream);
    *ptr = r ? NULL : (void *)(uintptr_t)p;
    return r;
}

EXPORT hipError_t hipFreeAsync(void *ptr, CUstream stream) {
    BOUND();
    return cu.cuMemFreeAsync((CUdeviceptr)(uintptr_t)ptr, stream);
}

EXPORT hipError_t hipMemsetAsync(void *dst, int value, size_t size, CUstream stream) {
    BOUND();
    return cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)dst, (unsigned char)value, size, stream);
}

EXPORT hipError_t hipMemcpyHtoDAsync(void *dst, const void *src, size_t size, CUstream stream) {
    BOUND();
    return cu.cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst, src, size, stream);
}

EXPORT hipError_t hipMemcpyDtoHAsync(void *dst, void *src, size_t size, CUstream stream) {
    BOUND();
    return cu.cuMemcpyDtoHAsync(dst, (CUdeviceptr)(uintptr_t)src, size, stream);
}

EXPORT hipError_t hipMemcpyDtoDAsync(void *dst, void *src, size_t size, CUstream stream) {
    BOUND();
    return cu.cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, size,
                                stream);
}

/* The image is NVRTC's PTX, NUL-terminated (hiprtcGetCode copies the terminator). */
EXPORT hipError_t hipModuleLoadData(CUmodule *module, const void *image) {
    BOUND();
    if (!module || !image) return hipErrorInvalidValue;
    return cu.cuModuleLoadData(module, image);
}

EXPORT hipError_t hipModuleGetFunction(CUfunction *function, CUmodule module, const char *name) {
    BOUND();
    if (!function || !name) return hipErrorInvalidValue;
    return cu.cuModuleGetFunction(function, module, name);
}

EXPORT hipError_t hipModuleUnload(CUmodule module) {
    BOUND();
    return cu.cuModuleUnload(module);
}

EXPORT hipError_t hipModuleLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                        unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                        CUstream stream, void **params, void **extra) {
    BOUND();
    return cu.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}

/* hipEventDefault/BlockingSync/DisableTiming/Interprocess are CUDA's 0/1/2/4. */
EXPORT hipError_t hipEventCreateWithFlags(CUevent *event, unsigned flags) {
    BOUND();
    if (!event || (flags & ~7u)) return hipErrorInvalidValue;
    return cu.cuEventCreate(event, flags);
}

EXPORT hipError_t hipEventRecord(CUevent event, CUstream stream) {
    BOUND();
    return cu.cuEventRecord(event, stream);
}

/* hipErrorNotReady and CUDA_ERROR_NOT_READY are both 600. */
EXPORT hipError_t hipEventQuery(CUevent event) {
    BOUND();
    return cu.cuEventQuery(event);
}

EXPORT hipError_t hipEventSynchronize(CUevent event) {
    BOUND();
    return cu.cuEventSynchronize(event);
}

EXPORT hipError_t hipEventElapsedTime(float *ms, CUevent start, CUevent end) {
    BOUND();
    if (!ms) return hipErrorInvalidValue;
    return cu.cuEventElapsedTime(ms, start, end);
}

EXPORT hipError_t hipEventDestroy(CUevent event) {
    BOUND();
    return cu.cuEventDestroy(event);
}

/* hipStreamCaptureMode: Global 0, ThreadLocal 1, Relaxed 2, as CUstreamCaptureMode. */
EXPORT hipError_t hipStreamBeginCapture(CUstream stream, int mode) {
    BOUND();
    if (mode < 0 || mode > 2) return hipErrorInvalidValue;
    return cu.cuStreamBeginCapture(stream, mode);
}

EXPORT hipError_t hipStreamEndCapture(CUstream stream, CUgraph *graph) {
    BOUND();
    if (!graph) return hipErrorInvalidValue;
    return cu.cuStreamEndCapture(stream, graph);
}

EXPORT hipError_t hipGraphInstantiate(CUgraphExec *exec, CUgraph graph, void **error_node,
                                      char *log, size_t log_size) {
    BOUND();
    if (!exec) return hipErrorInvalidValue;
    if (error_node) *error_node = NULL;
    hipError_t r = cu.cuGraphInstantiateWithFlags(exec, graph, 0);
    if (log && log_size > 0) snprintf(log, log_size, "%s", r ? hipGetErrorString(r) : "");
    return r;
}

EXPORT hipError_t hipGraphLaunch(CUgraphExec exec, CUstream stream) {
    BOUND();
    return cu.cuGraphLaunch(exec, stream);
}

EXPORT hipError_t hipGraphExecDestroy(CUgraphExec exec) {
    BOUND();
    return cu.cuGraphExecDestroy(exec);
}

EXPORT hipError_t hipGraphDestroy(CUgraph graph) {
    BOUND();
    return cu.cuGraphDestroy(graph);
}

/* ---- hiprtc over NVRTC ---- */

typedef struct _nvrtcProgram *nvrtcProgram;

static struct {
    void *lib;
    int (*nvrtcVersion)(int *, int *);
    const char *(*nvrtcGetErrorString)(int);
    int (*nvrtcCreateProgram)(nvrtcProgram *, const char *, const char *, int,
                              const char *const *, const char *const *);
    int (*nvrtcCompileProgram)(nvrtcProgram, int, const char *const *);
    int (*nvrtcDestroyProgram)(nvrtcProgram *);
    int (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t *);
    int (*nvrtcGetProgramLog)(nvrtcProgram, char *);
    int (*nvrtcGetPTXSize)(nvrtcProgram, size_t *);
    int (*nvrtcGetPTX)(nvrtcProgram, char *);
} rtc;

static pthread_once_t rtc_once = PTHREAD_ONCE_INIT;
static int rtc_ready;

/* The names cudarc (src/runtime/cuda.rs) tries on Linux, newest CUDA first: in a process that
 * already uses NVRTC through cudarc, the same library is found again. */
static void load_nvrtc(void) {
    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
                                        "libnvrtc.so.11", NULL};
    for (const char *const *n = names; *n && !rtc.lib; n++) rtc.lib = dlopen(*n, RTLD_NOW | RTLD_LOCAL);
    if (!rtc.lib) return;
#define RTC(field)                                              \
    *(void **)(&rtc.field) = dlsym(rtc.lib, #field);            \
    if (!rtc.field) return;
    RTC(nvrtcVersion)
    RTC(nvrtcGetErrorString)
    RTC(nvrtcCreateProgram)
    RTC(nvrtcCompileProgram)
    RTC(nvrtcDestroyProgram)
    RTC(nvrtcGetProgramLogSize)
    RTC(nvrtcGetProgramLog)
    RTC(nvrtcGetPTXSize)
    RTC(nvrtcGetPTX)
#undef RTC
    rtc_ready = 1;
}

static int nvrtc(void) {
    pthread_once(&rtc_once, load_nvrtc);
    return rtc_ready;
}

/* A program: NVRTC's, plus the log of an option this file refused before NVRTC saw it. */
struct program {
    nvrtcProgram p;
    char *refused;
};

EXPORT hiprtcResult hiprtcVersion(int *major, int *minor) {
    if (!major || !minor) return HIPRTC_ERROR_INVALID_INPUT;
    if (!nvrtc()) return HIPRTC_ERROR_INTERNAL_ERROR;
    return rtc.nvrtcVersion(major, minor);
}

EXPORT const char *hiprtcGetErrorString(hiprtcResult code) {
    if (nvrtc()) return rtc.nvrtcGetErrorString(code);
    if (code == HIPRTC_ERROR_INTERNAL_ERROR)
        return "hipshim: no NVRTC (libnvrtc.so.13, .so.12, .so) could be loaded";
    return code ? "hipshim: hiprtc error" : "HIPRTC_SUCCESS";
}

EXPORT hiprtcResult hiprtcCreateProgram(struct program **prog, const char *src, const char *name,
                                        int headers, const char *const *sources,
                                        const char *const *names) {
    if (!prog || !src) return HIPRTC_ERROR_INVALID_INPUT;
    if (!nvrtc()) return HIPRTC_ERROR_INTERNAL_ERROR;
    struct program *p = calloc(1, sizeof *p);
    if (!p) return HIPRTC_ERROR_OUT_OF_MEMORY;
    int r = rtc.nvrtcCreateProgram(&p->p, src, name, headers, sources, names);
    if (r) {
        free(p);
        return r;
    }
    *prog = p;
    return HIPRTC_SUCCESS;
}

/* hiprtc's options as NVRTC's: `--gpu-architecture=sm_XY` (what rocmforge passes) and
 * `--offload-arch=sm_XY` are NVRTC's architecture option; the -O levels are dropped (NVRTC
 * optimises by default and refuses -O3); an AMD target is refused with a log saying why;
 * anything else goes to NVRTC as it is. */
EXPORT hiprtcResult hiprtcCompileProgram(struct program *prog, int count,
                                         const char *const *options) {
    if (!prog || count < 0 || (count > 0 && !options)) return HIPRTC_ERROR_INVALID_INPUT;
    const char **out = calloc((size_t)count + 1, sizeof *out);
    char **owned = calloc((size_t)count + 1, sizeof *owned);
    if (!out || !owned) {
        free(out);
        free(owned);
        return HIPRTC_ERROR_OUT_OF_MEMORY;
    }
    int n = 0, result = HIPRTC_SUCCESS;
    for (int i = 0; i < count && result == HIPRTC_SUCCESS; i++) {
        const char *o = options[i];
        const char *arch = NULL;
        if (!strncmp(o, "--gpu-architecture=", 19)) arch = o + 19;
        else if (!strncmp(o, "--offload-arch=", 15)) arch = o + 15;
        if (arch) {
            if (strncmp(arch, "sm_", 3) && strncmp(arch, "compute_", 8)) {
                free(prog->refused);
                size_t len = strlen(arch) + 96;
                prog->refused = malloc(len);
                if (prog->refused)
                    snprintf(prog->refused, len,
                             "hipshim: `%s` is not an NVIDIA architecture; this hiprtc compiles "
                             "through NVRTC\n",
                             arch);
                result = HIPRTC_ERROR_INVALID_OPTION;
                break;
            }
            size_t len = strlen(arch) + 20;
            owned[n] = malloc(len);
            if (!owned[n]) {
                result = HIPRTC_ERROR_OUT_OF_MEMORY;
                break;
            }
            snprintf(owned[n], len, "--gpu-architecture=%s", arch);
            out[n] = owned[n];
            n++;
        } else if (o[0] == '-' && o[1] == 'O' && o[2] && !o[3]) {
            continue;
        } else {
            out[n++] = o;
        }
    }
    if (result == HIPRTC_SUCCESS) {
        free(prog->refused);
        prog->refused = NULL;
        result = rtc.nvrtcCompileProgram(prog->p, n, out);
    }
    for (int i = 0; i < count; i++) free(owned[i]);
    free(owned);
    free(out);
    return result;
}

EXPORT hiprtcResult hiprtcGetProgramLogSize(struct program *prog, size_t *size) {
    if (!prog || !size) return HIPRTC_ERROR_INVALID_INPUT;
    if (prog->refused) {
        *size = strlen(prog->refused) + 1;
        return HIPRTC_SUCCESS;
    }
    return rtc.nvrtcGetProgramLogSize(prog->p, size);
}

EXPORT hiprtcResult hiprtcGetProgramLog(struct program *prog, char *log) {
    if (!prog || !log) return HIPRTC_ERROR_INVALID_INPUT;
    if (prog->refused) {
        memcpy(log, prog->refused, strlen(prog->refused) + 1);
        return HIPRTC_SUCCESS;
    }
    return rtc.nvrtcGetProgramLog(prog->p, log);
}

/* The code is PTX, terminator included: hipModuleLoadData hands it to cuModuleLoadData. */
EXPORT hiprtcResult hiprtcGetCodeSize(struct program *prog, size_t *size) {
    if (!prog || !size) return HIPRTC_ERROR_INVALID_INPUT;
    return rtc.nvrtcGetPTXSize(prog->p, size);
}

EXPORT hiprtcResult hiprtcGetCode(struct program *prog, char *code) {
    if (!prog || !code) return HIPRTC_ERROR_INVALID_INPUT;
    return rtc.nvrtcGetPTX(prog->p, code);
}

EXPORT hiprtcResult hiprtcDestroyProgram(struct program **prog) {
    if (!prog || !*prog) return HIPRTC_ERROR_INVALID_INPUT;
    int r = rtc.nvrtcDestroyProgram(&(*prog)->p);
    free((*prog)->refused);
    free(*prog);
    *prog = NULL;
    return r;
}
