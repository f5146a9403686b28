/* eplb's fake ACL runtime (libascendcl.so), for tests only.
 *
 * Same exported symbols and signatures as the ACL runtime calls that eplb binds; written from the
 * documented C API (shared/research/cann-hccl.md), no vendor code. Semantics:
 *   - device memory is host memory, tracked in a table so that copies of the wrong kind, ranges
 *     out of bounds and double frees are reported as ACL_ERROR_INVALID_PARAM;
 *   - streams run synchronously: an "asynchronous" copy is done when the call returns; a failure
 *     of enqueued work is recorded on the stream and reported by its next synchronization;
 *   - a device must be bound to the calling thread (aclrtSetDevice) before memory or stream
 *     calls, and aclInit must come first (stricter than the real runtime, to catch binding bugs);
 *   - faults can be injected per symbol and device: fail the n-th call with a code, or hang it
 *     until the fake's timeout (fake_cann_fail / fake_cann_hang below). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_cann.h"

typedef int aclError;

enum { KIND_STREAM = 1, KIND_EVENT = 2 };

typedef struct {
    unsigned char *ptr;
    size_t size;
    int device;
    int pinned_host;
} alloc_t;

typedef struct {
    int kind;
    int device;
    int pending; /* deferred error of a stream; "recorded" flag of an event */
} handle_t;

typedef struct {
    char symbol[64];
    int device;
    uint32_t nth;
    uint32_t count;
    uint32_t seen;
    int code;
    int mode;
} fault_t;

#define MAX_FAULTS 64

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_initialized;
static alloc_t *g_allocs;
static size_t g_nallocs, g_capallocs;
static handle_t **g_handles;
static size_t g_nhandles, g_caphandles;
static fault_t g_faults[MAX_FAULTS];
static uint32_t g_timeout_ms = 5000;
static handle_t g_default_stream = {KIND_STREAM, -1, 0};

static __thread int t_device = -1;
static __thread char t_msg[512];
static __thread int t_has_msg;

void fake_cann_internal_set_msg(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_msg, sizeof t_msg, fmt, ap);
    va_end(ap);
    t_has_msg = 1;
}

uint32_t fake_cann_internal_timeout_ms(void) {
    pthread_mutex_lock(&g_mu);
    uint32_t t = g_timeout_ms;
    pthread_mutex_unlock(&g_mu);
    return t;
}

int fake_cann_internal_current_device(void) { return t_device; }

int fake_cann_internal_inject(const char *symbol, int device, int *code) {
    int mode = FAKE_NONE;
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < MAX_FAULTS; i++) {
        fault_t *f = &g_faults[i];
        if (f->mode == FAKE_NONE || strcmp(f->symbol, symbol) != 0) continue;
        if (f->device >= 0 && f->device != device) continue;
        f->seen++;
        if (f->seen >= f->nth && f->seen - f->nth < f->count && mode == FAKE_NONE) {
            mode = f->mode;
            *code = f->code;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return mode;
}

static int add_fault(const char *symbol, int device, uint32_t nth, uint32_t count, int code,
                     int mode) {
    if (symbol == NULL || strlen(symbol) >= sizeof g_faults[0].symbol || nth == 0 || count == 0)
        return -1;
    int rc = -1;
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < MAX_FAULTS; i++) {
        fault_t *f = &g_faults[i];
        if (f->mode != FAKE_NONE) continue;
        strcpy(f->symbol, symbol);
        f->device = device;
        f->nth = nth;
        f->count = count;
        f->seen = 0;
        f->code = code;
        f->mode = mode;
        rc = 0;
        break;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* Test hook: calls nth .. nth+count-1 (1-based, counted from now) of `symbol` on `device`
 * (-1: any device) return `code` without doing anything. Returns 0, or -1 on bad arguments or a
 * full table. */
FAKE_EXPORT int fake_cann_fail(const char *symbol, int device, uint32_t nth, uint32_t count,
                               int code) {
    return add_fault(symbol, device, nth, count, code, FAKE_FAIL);
}

/* Test hook: calls nth .. nth+count-1 of `symbol` on `device` hang until the fake's timeout.
 * For a call that receives (HcclRecv, HcclBatchSendRecv, HcclAllGather) its sends still go out,
 * the incoming data is lost, and the timeout is reported on the stream (and as the
 * communicator's async error); a stream synchronization reports a stream timeout. */
FAKE_EXPORT int fake_cann_hang(const char *symbol, int device, uint32_t nth, uint32_t count) {
    return add_fault(symbol, device, nth, count, 0, FAKE_HANG);
}

/* Test hook: removes the faults injected for `device` (-1: every fault). */
FAKE_EXPORT void fake_cann_clear(int device) {
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < MAX_FAULTS; i++)
        if (device < 0 || g_faults[i].device == device) g_faults[i].mode = FAKE_NONE;
    pthread_mutex_unlock(&g_mu);
}

/* Test hook: how long blocking calls wait for their peers (default 5000 ms). */
FAKE_EXPORT void fake_cann_set_timeout_ms(uint32_t ms) {
    pthread_mutex_lock(&g_mu);
    g_timeout_ms = ms;
    pthread_mutex_unlock(&g_mu);
}

/* Test hook: live aclrtMalloc allocations of `device` (-1: all devices). */
FAKE_EXPORT size_t fake_cann_live_allocations(int device) {
    size_t n = 0;
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < g_nallocs; i++)
        if (!g_allocs[i].pinned_host && (device < 0 || g_allocs[i].device == device)) n++;
    pthread_mutex_unlock(&g_mu);
    return n;
}

/* Test hook: live streams and events of `device` (-1: all devices). */
FAKE_EXPORT size_t fake_cann_live_handles(int device) {
    size_t n = 0;
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < g_nhandles; i++)
        if (device < 0 || g_handles[i]->device == device) n++;
    pthread_mutex_unlock(&g_mu);
    return n;
}

/* ---- tables (callers hold g_mu) ---- */

static alloc_t *find_alloc_containing(const void *p, size_t len, int pinned) {
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < g_nallocs; i++) {
        alloc_t *al = &g_allocs[i];
        uintptr_t b = (uintptr_t)al->ptr;
        if (al->pinned_host == pinned && a >= b && a - b <= al->size && len <= al->size - (a - b))
            return al;
    }
    return NULL;
}

static int push_alloc(alloc_t al) {
    if (g_nallocs == g_capallocs) {
        size_t cap = g_capallocs ? g_capallocs * 2 : 64;
        alloc_t *n = realloc(g_allocs, cap * sizeof *n);
        if (n == NULL) return -1;
        g_allocs = n;
        g_capallocs = cap;
    }
    g_allocs[g_nallocs++] = al;
    return 0;
}

static int remove_alloc(void *p, int pinned) {
    for (size_t i = 0; i < g_nallocs; i++) {
        if (g_allocs[i].ptr == p && g_allocs[i].pinned_host == pinned) {
            g_allocs[i] = g_allocs[--g_nallocs];
            return 0;
        }
    }
    return -1;
}

static int push_handle(handle_t *h) {
    if (g_nhandles == g_caphandles) {
        size_t cap = g_caphandles ? g_caphandles * 2 : 64;
        handle_t **n = realloc(g_handles, cap * sizeof *n);
        if (n == NULL) return -1;
        g_handles = n;
        g_caphandles = cap;
    }
    g_handles[g_nhandles++] = h;
    return 0;
}

static int handle_live(const void *h, int kind) {
    for (size_t i = 0; i < g_nhandles; i++)
        if (g_handles[i] == h) return g_handles[i]->kind == kind;
    return 0;
}

static int remove_handle(void *h, int kind) {
    for (size_t i = 0; i < g_nhandles; i++) {
        if (g_handles[i] == h && g_handles[i]->kind == kind) {
            g_handles[i] = g_handles[--g_nhandles];
            return 0;
        }
    }
    return -1;
}

int fake_cann_internal_is_device(const void *p, size_t len) {
    pthread_mutex_lock(&g_mu);
    int ok = find_alloc_containing(p, len, 0) != NULL;
    pthread_mutex_unlock(&g_mu);
    return ok;
}

int fake_cann_internal_stream_valid(void *stream) {
    if (stream == NULL) return 1;
    pthread_mutex_lock(&g_mu);
    int ok = handle_live(stream, KIND_STREAM);
    pthread_mutex_unlock(&g_mu);
    return ok;
}

void fake_cann_internal_stream_fail(void *stream, int acl_code) {
    pthread_mutex_lock(&g_mu);
    handle_t *h = stream == NULL ? &g_default_stream : (handle_t *)stream;
    if ((stream == NULL || handle_live(stream, KIND_STREAM)) && h->pending == 0)
        h->pending = acl_code;
    pthread_mutex_unlock(&g_mu);
}

/* Common entry checks: fault injection, then aclInit and a bound device. */
static aclError enter(const char *symbol, int need_device) {
    int code = 0;
    int mode = fake_cann_internal_inject(symbol, t_device, &code);
    if (mode == FAKE_FAIL) {
        fake_cann_internal_set_msg("%s: injected failure (code %d)", symbol, code);
        return code;
    }
    if (mode == FAKE_HANG) {
        uint32_t ms = fake_cann_internal_timeout_ms();
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
        fake_cann_internal_set_msg("%s: injected hang timed out after %u ms", symbol, ms);
        return ACL_ERROR_RT_STREAM_SYNC_TIMEOUT;
    }
    pthread_mutex_lock(&g_mu);
    int init = g_initialized;
    pthread_mutex_unlock(&g_mu);
    if (!init) {
        fake_cann_internal_set_msg("%s: aclInit has not been called", symbol);
        return ACL_ERROR_UNINITIALIZE;
    }
    if (need_device && t_device < 0) {
        fake_cann_internal_set_msg("%s: no device is bound to this thread (aclrtSetDevice)",
                                   symbol);
        return ACL_ERROR_RT_INVALID_DEVICEID;
    }
    return ACL_SUCCESS;
}

/* ---- the ACL API ---- */

FAKE_EXPORT aclError aclInit(const char *configPath) {
    (void)configPath;
    int code = 0;
    if (fake_cann_internal_inject("aclInit", t_device, &code) == FAKE_FAIL) {
        fake_cann_internal_set_msg("aclInit: injected failure (code %d)", code);
        return code;
    }
    pthread_mutex_lock(&g_mu);
    int again = g_initialized;
    g_initialized = 1;
    pthread_mutex_unlock(&g_mu);
    if (again) {
        fake_cann_internal_set_msg("aclInit: already initialized");
        return ACL_ERROR_REPEAT_INITIALIZE;
    }
    return ACL_SUCCESS;
}

FAKE_EXPORT aclError aclFinalize(void) { return ACL_SUCCESS; }

FAKE_EXPORT const char *aclGetRecentErrMsg(void) { return t_has_msg ? t_msg : NULL; }

FAKE_EXPORT aclError aclrtSetDevice(int32_t deviceId) {
    aclError rc = enter("aclrtSetDevice", 0);
    if (rc != ACL_SUCCESS) return rc;
    if (deviceId < 0 || deviceId >= 4096) {
        fake_cann_internal_set_msg("aclrtSetDevice: device %d out of range", deviceId);
        return ACL_ERROR_RT_INVALID_DEVICEID;
    }
    t_device = deviceId;
    return ACL_SUCCESS;
}

FAKE_EXPORT aclError aclrtResetDevice(int32_t deviceId) {
    if (t_device == deviceId) t_device = -1;
    return ACL_SUCCESS;
}

FAKE_EXPORT aclError aclrtGetDevice(int32_t *deviceId) {
    if (deviceId == NULL) return ACL_ERROR_INVALID_PARAM;
    if (t_device < 0) return ACL_ERROR_RT_INVALID_DEVICEID;
    *deviceId = t_device;
    return ACL_SUCCESS;
}

FAKE_EXPORT aclError aclrtGetDeviceCount(uint32_t *count) {
    if (count == NULL) return ACL_ERROR_INVALID_PARAM;
    *count = 4096;
    return ACL_SUCCESS;
}

FAKE_EXPORT const char *aclrtGetSocName(void) { return "FakeAscend"; }

/* A new live handle of `kind` on the calling thread's device, for `symbol`. */
static aclError create_handle(const char *symbol, int kind, void **out) {
    aclError rc = enter(symbol, 1);
    if (rc != ACL_SUCCESS) return rc;
    if (out == NULL) return ACL_ERROR_INVALID_PARAM;
    handle_t *h = calloc(1, sizeof *h);
    if (h == NULL) return ACL_ERROR_BAD_ALLOC;
    h->kind = kind;
    h->device = t_device;
    pthread_mutex_lock(&g_mu);
    int bad = push_handle(h);
    pthread_mutex_unlock(&g_mu);
    if (bad) {
        free(h);
        return ACL_ERROR_BAD_ALLOC;
    }
    *out = h;
    return ACL_SUCCESS;
}

/* Frees a live handle of `kind`; an unknown one is an error (with a message when `msg` is set). */
static aclError destroy_handle(void *h, int kind, const char *msg) {
    pthread_mutex_lock(&g_mu);
    int bad = remove_handle(h, kind);
    pthread_mutex_unlock(&g_mu);
    if (bad) {
        if (msg != NULL) fake_cann_internal_set_msg(msg, h);
        return ACL_ERROR_INVALID_RESOURCE_HANDLE;
    }
    free(h);
    return ACL_SUCCESS;
}

FAKE_EXPORT aclError aclrtCreateStream(void **stream) {
    return create_handle("aclrtCreateStream", KIND_STREAM, stream);
}

FAKE_EXPORT aclError aclrtDestroyStream(void *stream) {
    return destroy_handle(stream, KIND_STREAM, "aclrtDestroyStream: %p is not a live stream");
}

static aclError sync_stream(const char *symbol, void *stream) {
    aclError rc = enter(symbol, 1);
    if (rc != ACL_SUCCESS) return rc;
    pthread_mutex_lock(&g_mu);
    handle_t *h = stream == NULL ? &g_default_stream : (handle_t *)stream;
    if (stream != NULL && !handle_live(stream, KIND_STREAM)) {
        pthread_mutex_unlock(&g_mu);
        fake_cann_internal_set_msg("%s: %p is not a live stream", symbol, stream);
        return ACL_ERROR_INVALID_RESOURCE_HANDLE;
    }
    int pending = h->pending;
    h->pending = 0;
    pthread_mutex_unlock(&g_mu);
    if (pending != 0)
        fake_cann_internal_set_msg("%s: work on the stream failed (code %d)", symbol, pending);
    return pending;
}

FAKE_EXPORT aclError aclrtSynchronizeStream(void *stream) {
    return sync_stream("aclrtSynchronizeStream", stream);
}

FAKE_EXPORT aclError aclrtSynchronizeStreamWithTimeout(void *stream, int32_t timeout) {
    if (timeout < -1) return ACL_ERROR_INVALID_PARAM;
    return sync_stream("aclrtSynchronizeStreamWithTimeout", stream);
}

FAKE_EXPORT aclError aclrtMalloc(void **devPtr, size_t size, uint32_t policy) {
    (void)policy;
    aclError rc = enter("aclrtMalloc", 1);
    if (rc != ACL_SUCCESS) return rc;
    if (devPtr == NULL || size == 0) {
        fake_cann_internal_set_msg("aclrtMalloc: null pointer or zero size");
        return ACL_ERROR_INVALID_PARAM;
    }
    /* Like the real runtime: round up to 32 bytes and pad 32 more. */
    size_t padded = ((size + 31) / 32) * 32 + 32;
    unsigned char *p = malloc(padded);
    if (p == NULL) return ACL_ERROR_BAD_ALLOC;
    memset(p, 0xA5, padded);
    alloc_t al = {p, size, t_device, 0};
    pthread_mutex_lock(&g_mu);
    int bad = push_alloc(al);
    pthread_mutex_unlock(&g_mu);
    if (bad) {
        free(p);
        return ACL_ERROR_BAD_ALLOC;
    }
    *devPtr = p;
    return ACL_SUCCESS;
}

FAKE_EXPORT aclError aclrtFree(void *devPtr) {
    pthread_mutex_lock(&g_mu);
    int bad = remove_alloc(devPtr, 0);
    pthread_mutex_unlock(&g_mu);
    if (bad) {
        fake_cann_internal_set_msg("aclrtFree: %p is not live device memory", devPtr);
        return ACL_ERROR_INVALID_PARAM;
    }
    free(devPtr);
    return ACL_SUCCESS;
}

FAKE_EXPORT aclError aclrtMallocHost(void **hostPtr, size_t size) {
    aclError rc = enter("aclrtMallocHost", 1);
    if (rc != ACL_SUCCESS) return rc;
    if (hostPtr == NULL || size == 0) return ACL_ERROR_INVALID_PARAM;
    unsigned char *p = malloc(size);
    if (p == NULL) return ACL_ERROR_BAD_ALLOC;
    alloc_t al = {p, size, t_device, 1};
    pthread_mutex_lock(&g_mu);
    int bad = push_alloc(al);
    pthread_mutex_unlock(&g_mu);
    if (bad) {
        free(p);
        return ACL_ERROR_BAD_ALLOC;
    }
    *hostPtr = p;
    return ACL_SUCCESS;
}

FAKE_EXPORT aclError aclrtFreeHost(void *hostPtr) {
    pthread_mutex_lock(&g_mu);
    int bad = remove_alloc(hostPtr, 1);
    pthread_mutex_unlock(&g_mu);
    if (bad) {
        fake_cann_internal_set_msg("aclrtFreeHost: %p is not live pinned host memory", hostPtr);
        return ACL_ERROR_INVALID_PARAM;
    }
    free(hostPtr);
    return ACL_SUCCESS;
}

static aclError copy(const char *symbol, void *dst, size_t destMax, const void *src, size_t count,
                     uint32_t kind) {
    aclError rc = enter(symbol, 1);
    if (rc != ACL_SUCCESS) return rc;
    if (dst == NULL || src == NULL || count > destMax) {
        fake_cann_internal_set_msg("%s: null pointer or count %zu > destMax %zu", symbol, count,
                                   destMax);
        return ACL_ERROR_INVALID_PARAM;
    }
    if (count == 0) return ACL_SUCCESS;
    pthread_mutex_lock(&g_mu);
    int src_dev = find_alloc_containing(src, count, 0) != NULL;
    int dst_dev = find_alloc_containing(dst, count, 0) != NULL;
    int src_any = src_dev || find_alloc_containing(src, 1, 0) != NULL;
    int dst_any = dst_dev || find_alloc_containing(dst, 1, 0) != NULL;
    pthread_mutex_unlock(&g_mu);
    int ok;
    switch (kind) {
    case 0: ok = !src_any && !dst_any; break; /* host to host */
    case 1: ok = !src_any && dst_dev; break;  /* host to device */
    case 2: ok = src_dev && !dst_any; break;  /* device to host */
    case 3: ok = src_dev && dst_dev; break;   /* device to device */
    case 4: ok = (src_dev || !src_any) && (dst_dev || !dst_any); break;
    default: ok = 0;
    }
    if (!ok) {
        fake_cann_internal_set_msg(
            "%s: kind %u does not match the buffers (src %s, dst %s, %zu bytes)", symbol, kind,
            src_dev ? "device" : (src_any ? "device, out of bounds" : "host"),
            dst_dev ? "device" : (dst_any ? "device, out of bounds" : "host"), count);
        return ACL_ERROR_INVALID_PARAM;
    }
    memmove(dst, src, count);
    return ACL_SUCCESS;
}

FAKE_EXPORT aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
                                 uint32_t kind) {
    return copy("aclrtMemcpy", dst, destMax, src, count, kind);
}

FAKE_EXPORT aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count,
                                      uint32_t kind, void *stream) {
    if (!fake_cann_internal_stream_valid(stream)) {
        fake_cann_internal_set_msg("aclrtMemcpyAsync: %p is not a live stream", stream);
        return ACL_ERROR_INVALID_RESOURCE_HANDLE;
    }
    return copy("aclrtMemcpyAsync", dst, destMax, src, count, kind);
}

FAKE_EXPORT aclError aclrtCreateEvent(void **event) {
    return create_handle("aclrtCreateEvent", KIND_EVENT, event);
}

FAKE_EXPORT aclError aclrtDestroyEvent(void *event) {
    return destroy_handle(event, KIND_EVENT, NULL);
}

FAKE_EXPORT aclError aclrtRecordEvent(void *event, void *stream) {
    aclError rc = enter("aclrtRecordEvent", 1);
    if (rc != ACL_SUCCESS) return rc;
    pthread_mutex_lock(&g_mu);
    int ok = handle_live(event, KIND_EVENT) && (stream == NULL || handle_live(stream, KIND_STREAM));
    if (ok) ((handle_t *)event)->pending = 1; /* streams are synchronous: complete at once */
    pthread_mutex_unlock(&g_mu);
    return ok ? ACL_SUCCESS : ACL_ERROR_INVALID_RESOURCE_HANDLE;
}

FAKE_EXPORT aclError aclrtSynchronizeEvent(void *event) {
    aclError rc = enter("aclrtSynchronizeEvent", 1);
    if (rc != ACL_SUCCESS) return rc;
    pthread_mutex_lock(&g_mu);
    int ok = handle_live(event, KIND_EVENT);
    pthread_mutex_unlock(&g_mu);
    return ok ? ACL_SUCCESS : ACL_ERROR_INVALID_RESOURCE_HANDLE;
}

FAKE_EXPORT aclError aclrtQueryEventStatus(void *event, uint32_t *status) {
    if (status == NULL) return ACL_ERROR_INVALID_PARAM;
    pthread_mutex_lock(&g_mu);
    int ok = handle_live(event, KIND_EVENT);
    if (ok) *status = ((handle_t *)event)->pending ? 1u : 0u;
    pthread_mutex_unlock(&g_mu);
    return ok ? ACL_SUCCESS : ACL_ERROR_INVALID_RESOURCE_HANDLE;
}

FAKE_EXPORT aclError aclrtStreamWaitEvent(void *stream, void *event) {
    pthread_mutex_lock(&g_mu);
    int ok = handle_live(event, KIND_EVENT) && (stream == NULL || handle_live(stream, KIND_STREAM));
    pthread_mutex_unlock(&g_mu);
    return ok ? ACL_SUCCESS : ACL_ERROR_INVALID_RESOURCE_HANDLE;
}
