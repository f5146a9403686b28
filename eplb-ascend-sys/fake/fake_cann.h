/* Internal interface between the two libraries of eplb's fake CANN (test-only).
 *
 * libascendcl.so owns the shared state (device memory table, streams, fault injection, the
 * thread's last error message); libhccl.so links against it and reaches that state through the
 * fake_cann_internal_* functions below. Nothing here is part of the real CANN API. */
#ifndef EPLB_FAKE_CANN_H
#define EPLB_FAKE_CANN_H

#include <stddef.h>
#include <stdint.h>

#define FAKE_EXPORT __attribute__((visibility("default")))

/* ACL codes used by the fake (values from the public CANN headers). */
#define ACL_SUCCESS 0
#define ACL_ERROR_INVALID_PARAM 100000
#define ACL_ERROR_UNINITIALIZE 100001
#define ACL_ERROR_REPEAT_INITIALIZE 100002
#define ACL_ERROR_BAD_ALLOC 200000
#define ACL_ERROR_INVALID_DEVICE 200002
#define ACL_ERROR_INVALID_RESOURCE_HANDLE 200005
#define ACL_ERROR_RT_PARAM_INVALID 107000
#define ACL_ERROR_RT_INVALID_DEVICEID 107001
#define ACL_ERROR_RT_INTERNAL_ERROR 507000
#define ACL_ERROR_RT_STREAM_SYNC_TIMEOUT 507046

/* What an injected fault asks of the call that hits it. */
#define FAKE_NONE 0
#define FAKE_FAIL 1
#define FAKE_HANG 2

/* Looks up the fault injected for `symbol` on `device`; counts the call. Returns FAKE_NONE,
 * FAKE_FAIL (with *code set) or FAKE_HANG. */
FAKE_EXPORT int fake_cann_internal_inject(const char *symbol, int device, int *code);
/* The device bound to the calling thread by aclrtSetDevice, or -1. */
FAKE_EXPORT int fake_cann_internal_current_device(void);
/* 1 when [p, p + len) lies inside one live device allocation. */
FAKE_EXPORT int fake_cann_internal_is_device(const void *p, size_t len);
/* 1 when `stream` is a live stream (or NULL, the default stream). */
FAKE_EXPORT int fake_cann_internal_stream_valid(void *stream);
/* Records a deferred failure on `stream`: its next synchronization reports `acl_code`. */
FAKE_EXPORT void fake_cann_internal_stream_fail(void *stream, int acl_code);
/* Sets the calling thread's recent error message (aclGetRecentErrMsg). */
FAKE_EXPORT void fake_cann_internal_set_msg(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
/* How long a blocking call (receive, collective, join) waits for its peers, in ms. */
FAKE_EXPORT uint32_t fake_cann_internal_timeout_ms(void);

#endif
