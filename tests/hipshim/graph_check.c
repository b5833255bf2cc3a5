/*
 * Drives hipshim's graph entry points the way rocmforge's replay will (stream capture of a
 * launch on a non-blocking stream, instantiate, launch several times), with the hiprtc ones
 * beside them: `graph_check /path/to/libhipshim.so`. Prints "ok" and exits 0 when every
 * result is as it must be, else names the first that is not and exits 1. The GPU suite runs it
 * (`hip::shim::graph_capture_replays`) until rocmforge's own hipGraph replay trials exist.
 * Like the shim, this checks plumbing on an NVIDIA GPU, not AMD hardware.
 */

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void *H;
static void *lib;

static void *sym(const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        printf("no symbol %s\n", name);
        exit(1);
    }
    return p;
}

#define CHECK(call)                                                     \
    do {                                                                \
        int r_ = (call);                                                \
        if (r_) {                                                       \
            printf("%s failed: %d (%s)\n", #call, r_, errstr(r_));      \
            exit(1);                                                    \
        }                                                               \
    } while (0)

static const char *(*errstr)(int);

static const char *SOURCE =
    "extern \"C\" __global__ void add_one(float *x, unsigned n) {\n"
    "    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) x[i] += 1.0f;\n"
    "}\n";

static int called;
static void on_done(H stream, int status, void *data) {
    (void)stream;
    if (status == 0 && data == &called) called = 1;
}

int main(int argc, char **argv) {
    if (argc != 2 || !(lib = dlopen(argv[1], RTLD_NOW))) {
        printf("usage: graph_check LIBRARY (%s)\n", dlerror());
        return 1;
    }
    errstr = (const char *(*)(int))sym("hipGetErrorString");
    int (*hipInit)(unsigned) = sym("hipInit");
    int (*hipSetDevice)(int) = sym("hipSetDevice");
    int (*props)(void *, int) = sym("hipGetDevicePropertiesR0600");
    int (*rtcCreate)(H *, const char *, const char *, int, const char **, const char **) =
        sym("hiprtcCreateProgram");
    int (*rtcCompile)(H, int, const char **) = sym("hiprtcCompileProgram");
    int (*rtcLogSize)(H, size_t *) = sym("hiprtcGetProgramLogSize");
    int (*rtcLog)(H, char *) = sym("hiprtcGetProgramLog");
    int (*rtcCodeSize)(H, size_t *) = sym("hiprtcGetCodeSize");
    int (*rtcCode)(H, char *) = sym("hiprtcGetCode");
    int (*rtcDestroy)(H *) = sym("hiprtcDestroyProgram");
    int (*loadData)(H *, const void *) = sym("hipModuleLoadData");
    int (*getFunction)(H *, H, const char *) = sym("hipModuleGetFunction");
    int (*unload)(H) = sym("hipModuleUnload");
    int (*streamCreate)(H *, unsigned) = sym("hipStreamCreateWithFlags");
    int (*streamDestroy)(H) = sym("hipStreamDestroy");
    int (*streamSync)(H) = sym("hipStreamSynchronize");
    int (*mallocAsync)(H *, size_t, H) = sym("hipMallocAsync");
    int (*freeAsync)(H, H) = sym("hipFreeAsync");
    int (*memsetAsync)(H, int, size_t, H) = sym("hipMemsetAsync");
    int (*dtoh)(void *, H, size_t, H) = sym("hipMemcpyDtoHAsync");
    int (*launch)(H, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, H,
                  void **, void **) = sym("hipModuleLaunchKernel");
    int (*begin)(H, int) = sym("hipStreamBeginCapture");
    int (*end)(H, H *) = sym("hipStreamEndCapture");
    int (*instantiate)(H *, H, H *, char *, size_t) = sym("hipGraphInstantiate");
    int (*graphLaunch)(H, H) = sym("hipGraphLaunch");
    int (*execDestroy)(H) = sym("hipGraphExecDestroy");
    int (*graphDestroy)(H) = sym("hipGraphDestroy");
    int (*eventCreate)(H *, unsigned) = sym("hipEventCreateWithFlags");
    int (*eventRecord)(H, H) = sym("hipEventRecord");
    int (*eventElapsed)(float *, H, H) = sym("hipEventElapsedTime");
    int (*eventDestroy)(H) = sym("hipEventDestroy");
    int (*addCallback)(H, void (*)(H, int, void *), void *, unsigned) =
        sym("hipStreamAddCallback");

    CHECK(hipInit(0));
    CHECK(hipSetDevice(0));
    static unsigned char p[16384];
    CHECK(props(p, 0));
    const char *arch = (const char *)p + 1160;
    if (strncmp(arch, "sm_", 3)) {
        printf("gcnArchName is `%s`, not an sm_ name\n", arch);
        return 1;
    }

    /* An AMD target is refused before NVRTC, with a log that says why. */
    H prog;
    CHECK(rtcCreate(&prog, SOURCE, "add_one.hip", 0, NULL, NULL));
    const char *amd[] = {"--gpu-architecture=gfx90a"};
    if (rtcCompile(prog, 1, amd) != 5) {
        printf("gfx90a was not refused as an invalid option\n");
        return 1;
    }
    size_t n_log = 0;
    CHECK(rtcLogSize(prog, &n_log));
    char *log = malloc(n_log);
    CHECK(rtcLog(prog, log));
    if (!strstr(log, "gfx90a")) {
        printf("refusal log: %s\n", log);
        return 1;
    }
    free(log);
    /* The target rocmforge passes, and an -O level NVRTC would refuse. */
    char target[64];
    snprintf(target, sizeof target, "--gpu-architecture=%.40s", arch);
    const char *nv[] = {target, "-O3"};
    CHECK(rtcCompile(prog, 2, nv));
    size_t n_code = 0;
    CHECK(rtcCodeSize(prog, &n_code));
    char *code = malloc(n_code);
    CHECK(rtcCode(prog, code));
    CHECK(rtcDestroy(&prog));
    if (prog) {
        printf("hiprtcDestroyProgram left the handle set\n");
        return 1;
    }

    H module, fn, stream, buf, graph, exec, start, stop;
    CHECK(loadData(&module, code));
    free(code);
    CHECK(getFunction(&fn, module, "add_one"));
    CHECK(streamCreate(&stream, 1));
    unsigned n = 1000;
    size_t bytes = n * sizeof(float);
    CHECK(mallocAsync(&buf, bytes, stream));
    CHECK(memsetAsync(buf, 0, bytes, stream));
    CHECK(streamSync(stream));

    if (begin(stream, 3) == 0) {
        printf("capture mode 3 was accepted\n");
        return 1;
    }
    void *args[] = {&buf, &n};
    CHECK(begin(stream, 2 /* hipStreamCaptureModeRelaxed */));
    CHECK(launch(fn, (n + 255) / 256, 1, 1, 256, 1, 1, 0, stream, args, NULL));
    CHECK(end(stream, &graph));
    char ilog[64] = "x";
    H error_node = &ilog;
    CHECK(instantiate(&exec, graph, &error_node, ilog, sizeof ilog));
    if (error_node || ilog[0]) {
        printf("instantiate left an error node or log\n");
        return 1;
    }
    /* Capture only recorded the launch: nothing ran yet. */
    CHECK(eventCreate(&start, 0));
    CHECK(eventCreate(&stop, 0));
    CHECK(eventRecord(start, stream));
    for (int i = 0; i < 3; i++) CHECK(graphLaunch(exec, stream));
    CHECK(eventRecord(stop, stream));
    CHECK(addCallback(stream, on_done, &called, 0));
    float *host = malloc(bytes);
    CHECK(dtoh(host, buf, bytes, stream));
    CHECK(streamSync(stream));
    float ms = -1;
    CHECK(eventElapsed(&ms, start, stop));
    for (unsigned i = 0; i < n; i++) {
        if (host[i] != 3.0f) {
            printf("element %u is %g after 3 replays, want 3\n", i, host[i]);
            return 1;
        }
    }
    if (!called || ms < 0) {
        printf("callback ran: %d, elapsed %g ms\n", called, ms);
        return 1;
    }
    free(host);
    CHECK(execDestroy(exec));
    CHECK(graphDestroy(graph));
    CHECK(eventDestroy(start));
    CHECK(eventDestroy(stop));
    CHECK(freeAsync(buf, stream));
    CHECK(streamSync(stream));
    CHECK(streamDestroy(stream));
    CHECK(unload(module));
    printf("ok\n");
    return 0;
}
