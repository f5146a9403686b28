/* eplb's fake HCCL (libhccl.so), for tests only.
 *
 * Same exported symbols and signatures as the HCCL calls that eplb binds; written from the
 * documented C API (shared/research/cann-hccl.md), no vendor code. HCCL ranks are threads of one
 * process: HcclGetRootInfo writes a world key into the 4108-byte root info, and
 * HcclCommInitRootInfo joins the in-process world of that key and blocks until every rank has
 * joined. Streams run synchronously (see fake_acl.c): a send is copied into the peer's mailbox at
 * once, a receive blocks until its message arrives or the fake's timeout passes.
 *
 * Rules enforced (the real library's, as documented):
 *   - immediately, with HCCL_E_PARA: null pointers, rank out of range or equal to the caller's,
 *     unknown data type or send/recv type, buffers outside device memory, more than one buffer
 *     per direction per peer in one HcclBatchSendRecv, a bad stream, HcclBatchSendRecv inside a
 *     group;
 *   - when the peers meet (reported on the stream, by HcclGetCommAsyncError and
 *     aclGetRecentErrMsg): a receive whose matching send has another count or data type
 *     (HCCL_E_PARA), a receive or collective whose peers do not come in time (HCCL_E_TIMEOUT;
 *     a collective waits twice the timeout plus 100 ms),
 *     collectives whose ranks disagree on count or type (HCCL_E_PARA);
 *   - sends and receives between two ranks match in posting order; a send completes when its
 *     receiver takes it: one that nobody takes within the timeout is withdrawn and reported as
 *     a timeout on the sender's stream (so a rank that skips an exchange leaves nothing behind
 *     for the next one). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_cann.h"

typedef uint32_t HcclResult;
enum {
    HCCL_SUCCESS = 0,
    HCCL_E_PARA = 1,
    HCCL_E_PTR = 2,
    HCCL_E_INTERNAL = 4,
    HCCL_E_NOT_SUPPORT = 5,
    HCCL_E_RUNTIME = 15,
    HCCL_E_TIMEOUT = 9,
};

#define ROOT_INFO_BYTES 4108
#define COMM_MAGIC 0x48434f4du /* "HCOM" */
static const char ROOT_MAGIC[8] = {'F', 'A', 'K', 'E', 'H', 'C', 'C', 'L'};

typedef struct {
    uint32_t type; /* 0 send, 1 recv */
    void *buf;
    uint64_t count;
    uint32_t dtype;
    uint32_t remote;
} item_t; /* the layout of HcclSendRecvItem */

typedef struct msg {
    struct msg *next;
    uint64_t seq;
    uint64_t count;
    uint32_t dtype;
    size_t bytes;
    unsigned char data[];
} msg_t;

typedef struct round {
    struct round *next;
    uint64_t seq;
    uint32_t arrived, left;
    uint64_t count;
    uint32_t dtype;
    HcclResult error;
    unsigned char *data;
} round_t;

typedef struct world {
    struct world *next;
    uint64_t key;
    uint32_t n, joined, alive;
    unsigned char *present;
    msg_t **mail; /* [src * n + dst], FIFO */
    uint64_t *send_seq; /* [src * n + dst]: identity of the next message */
    round_t *rounds;
} world_t;

typedef struct {
    uint32_t magic;
    world_t *w;
    uint32_t rank;
    int device;
    uint64_t coll_seq;
    HcclResult async_error;
} comm_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static world_t *g_worlds;
static uint64_t g_next_key = 1;

/* HcclGroupStart/End: queued point-to-point calls of this thread. */
static __thread int t_group;
static __thread item_t *t_items;
static __thread size_t t_nitems, t_capitems;
static __thread comm_t *t_group_comm;
static __thread void *t_group_stream;

static size_t dtype_size(uint32_t t) {
    switch (t) {
    case 0: case 7: case 14: case 15: case 16: case 17: return 1; /* INT8 UINT8 HIF8 FP8* */
    case 1: case 3: case 8: case 11: return 2;                   /* INT16 FP16 UINT16 BFP16 */
    case 2: case 4: case 9: return 4;                            /* INT32 FP32 UINT32 */
    case 5: case 6: case 10: return 8;                           /* INT64 UINT64 FP64 */
    case 12: return 16;                                          /* INT128 */
    default: return 0;
    }
}

static struct timespec deadline_in(uint32_t ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec += 1;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* Waits on g_cv (g_mu held) until `deadline`; returns 0 once it has passed. */
static int wait_until(const struct timespec *deadline) {
    return pthread_cond_timedwait(&g_cv, &g_mu, deadline) != ETIMEDOUT;
}

static void sleep_ms(uint32_t ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static HcclResult fail(HcclResult code, const char *fmt, const char *a, long b, long c) {
    fake_cann_internal_set_msg(fmt, a, b, c);
    return code;
}

static int comm_ok(const comm_t *c) { return c != NULL && c->magic == COMM_MAGIC; }

/* Records a failure found while the work ran: reported on the stream and as the async error. */
static void deferred(comm_t *c, void *stream, HcclResult code) {
    if (c->async_error == HCCL_SUCCESS) c->async_error = code;
    fake_cann_internal_stream_fail(stream, code == HCCL_E_TIMEOUT ? ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
                                                                  : ACL_ERROR_RT_INTERNAL_ERROR);
}

static void free_world(world_t *w) {
    for (uint32_t i = 0; i < w->n * w->n; i++) {
        msg_t *m = w->mail[i];
        while (m) {
            msg_t *next = m->next;
            free(m);
            m = next;
        }
    }
    round_t *r = w->rounds;
    while (r) {
        round_t *next = r->next;
        free(r->data);
        free(r);
        r = next;
    }
    free(w->present);
    free(w->mail);
    free(w->send_seq);
    free(w);
}

/* Drops one member of `w` (g_mu held): the last one unlinks and frees the world. */
static void release_world(world_t *w) {
    w->alive--;
    if (w->alive == 0) {
        world_t **pp = &g_worlds;
        while (*pp != w) pp = &(*pp)->next;
        *pp = w->next;
        free_world(w);
    }
}

/* ---- communicator management ---- */

FAKE_EXPORT const char *HcclGetErrorString(HcclResult code) {
    static const char *names[] = {
        "no error", "parameter error", "empty pointer", "memory error", "internal error",
        "not support feature", "not found specific resource", "resource unavailable",
        "call system interface error", "timeout", "open file fail", "tcp connect fail",
        "roce connect fail", "tcp transfer fail", "roce transfer fail", "call runtime api fail",
        "call driver api fail", "call profiling api fail", "call cce api fail",
        "call network api fail", "try again", "error cqe", "suspending", "retry failed",
        "out of memory"};
    if (code < sizeof names / sizeof names[0]) return names[code];
    return "unknown error";
}

FAKE_EXPORT HcclResult HcclGetRootInfo(void *rootInfo) {
    if (rootInfo == NULL) return fail(HCCL_E_PTR, "HcclGetRootInfo: %s", "null root info", 0, 0);
    int code = 0;
    if (fake_cann_internal_inject("HcclGetRootInfo", fake_cann_internal_current_device(), &code) ==
        FAKE_FAIL)
        return fail((HcclResult)code, "%s: injected failure (code %ld)", "HcclGetRootInfo", code, 0);
    pthread_mutex_lock(&g_mu);
    uint64_t key = g_next_key++;
    pthread_mutex_unlock(&g_mu);
    unsigned char *p = rootInfo;
    memset(p, 0, ROOT_INFO_BYTES);
    memcpy(p, ROOT_MAGIC, sizeof ROOT_MAGIC);
    memcpy(p + 8, &key, sizeof key);
    uint32_t pid = (uint32_t)getpid();
    memcpy(p + 16, &pid, sizeof pid);
    return HCCL_SUCCESS;
}

FAKE_EXPORT HcclResult HcclCommInitRootInfo(uint32_t nRanks, const void *rootInfo, uint32_t rank,
                                            void **comm) {
    const char *sym = "HcclCommInitRootInfo";
    if (rootInfo == NULL || comm == NULL) return fail(HCCL_E_PTR, "%s: null pointer", sym, 0, 0);
    const unsigned char *p = rootInfo;
    uint64_t key;
    uint32_t pid;
    memcpy(&key, p + 8, sizeof key);
    memcpy(&pid, p + 16, sizeof pid);
    if (memcmp(p, ROOT_MAGIC, sizeof ROOT_MAGIC) != 0 || pid != (uint32_t)getpid())
        return fail(HCCL_E_PARA, "%s: root info was not made by HcclGetRootInfo here", sym, 0, 0);
    if (nRanks == 0 || rank >= nRanks)
        return fail(HCCL_E_PARA, "%s: rank %ld out of range for %ld ranks", sym, (long)rank,
                    (long)nRanks);
    int device = fake_cann_internal_current_device();
    if (device < 0)
        return fail(HCCL_E_RUNTIME, "%s: no device is bound to this thread", sym, 0, 0);
    int code = 0;
    if (fake_cann_internal_inject(sym, device, &code) == FAKE_FAIL)
        return fail((HcclResult)code, "%s: injected failure (code %ld)", sym, code, 0);
    comm_t *c = calloc(1, sizeof *c);
    if (c == NULL) return HCCL_E_INTERNAL;
    pthread_mutex_lock(&g_mu);
    world_t *w = g_worlds;
    while (w && w->key != key) w = w->next;
    if (w == NULL) {
        w = calloc(1, sizeof *w);
        if (w) {
            w->key = key;
            w->n = nRanks;
            w->present = calloc(nRanks, 1);
            w->mail = calloc((size_t)nRanks * nRanks, sizeof *w->mail);
            w->send_seq = calloc((size_t)nRanks * nRanks, sizeof *w->send_seq);
            if (!w->present || !w->mail || !w->send_seq) {
                free_world(w);
                w = NULL;
            }
        }
        if (w == NULL) {
            pthread_mutex_unlock(&g_mu);
            free(c);
            return HCCL_E_INTERNAL;
        }
        w->next = g_worlds;
        g_worlds = w;
    }
    if (w->n != nRanks || w->present[rank]) {
        uint32_t n = w->n;
        pthread_mutex_unlock(&g_mu);
        free(c);
        return fail(HCCL_E_PARA, "%s: rank %ld joined twice, or the world has %ld ranks", sym,
                    (long)rank, (long)n);
    }
    w->present[rank] = 1;
    w->joined++;
    w->alive++;
    pthread_cond_broadcast(&g_cv);
    struct timespec dl = deadline_in(fake_cann_internal_timeout_ms());
    while (w->joined < w->n) {
        if (!wait_until(&dl) && w->joined < w->n) {
            w->present[rank] = 0;
            w->joined--;
            release_world(w);
            pthread_mutex_unlock(&g_mu);
            free(c);
            return fail(HCCL_E_TIMEOUT, "%s: rank %ld: peers did not join in time (%ld ms)", sym,
                        (long)rank, (long)fake_cann_internal_timeout_ms());
        }
    }
    pthread_mutex_unlock(&g_mu);
    c->magic = COMM_MAGIC;
    c->w = w;
    c->rank = rank;
    c->device = device;
    *comm = c;
    return HCCL_SUCCESS;
}

FAKE_EXPORT HcclResult HcclCommInitClusterInfo(const char *clusterInfo, uint32_t rank,
                                               void **comm) {
    (void)clusterInfo;
    (void)rank;
    (void)comm;
    return fail(HCCL_E_NOT_SUPPORT, "%s: rank tables are not supported by the fake CANN",
                "HcclCommInitClusterInfo", 0, 0);
}

FAKE_EXPORT HcclResult HcclCommDestroy(void *comm) {
    comm_t *c = comm;
    if (!comm_ok(c)) return fail(HCCL_E_PTR, "%s: not a communicator", "HcclCommDestroy", 0, 0);
    pthread_mutex_lock(&g_mu);
    world_t *w = c->w;
    release_world(w);
    pthread_mutex_unlock(&g_mu);
    c->magic = 0;
    free(c);
    return HCCL_SUCCESS;
}

FAKE_EXPORT HcclResult HcclGetRankSize(void *comm, uint32_t *rankSize) {
    comm_t *c = comm;
    if (!comm_ok(c) || rankSize == NULL) return HCCL_E_PTR;
    *rankSize = c->w->n;
    return HCCL_SUCCESS;
}

FAKE_EXPORT HcclResult HcclGetRankId(void *comm, uint32_t *rank) {
    comm_t *c = comm;
    if (!comm_ok(c) || rank == NULL) return HCCL_E_PTR;
    *rank = c->rank;
    return HCCL_SUCCESS;
}

FAKE_EXPORT HcclResult HcclGetCommAsyncError(void *comm, HcclResult *asyncError) {
    comm_t *c = comm;
    if (!comm_ok(c) || asyncError == NULL) return HCCL_E_PTR;
    pthread_mutex_lock(&g_mu);
    *asyncError = c->async_error;
    pthread_mutex_unlock(&g_mu);
    return HCCL_SUCCESS;
}

/* ---- point to point ---- */

static HcclResult check_items(const char *sym, comm_t *c, const item_t *items, uint32_t n,
                              void *stream, int batch) {
    if (!comm_ok(c)) return fail(HCCL_E_PTR, "%s: not a communicator", sym, 0, 0);
    if (n > 0 && items == NULL) return fail(HCCL_E_PTR, "%s: null item list", sym, 0, 0);
    if (!fake_cann_internal_stream_valid(stream))
        return fail(HCCL_E_PARA, "%s: not a live stream", sym, 0, 0);
    for (uint32_t i = 0; i < n; i++) {
        const item_t *it = &items[i];
        size_t sz = dtype_size(it->dtype);
        if (it->type > 1 || sz == 0)
            return fail(HCCL_E_PARA, "%s: item %ld: bad send/recv type or data type %ld", sym,
                        (long)i, (long)it->dtype);
        if (it->remote >= c->w->n || it->remote == c->rank)
            return fail(HCCL_E_PARA, "%s: item %ld: remote rank %ld out of range or self", sym,
                        (long)i, (long)it->remote);
        if (it->count > 0 && (it->buf == NULL || it->count > SIZE_MAX / sz ||
                              !fake_cann_internal_is_device(it->buf, (size_t)it->count * sz)))
            return fail(HCCL_E_PARA, "%s: item %ld: buffer is not %ld elements of device memory",
                        sym, (long)i, (long)it->count);
        if (batch)
            for (uint32_t j = 0; j < i; j++)
                if (items[j].type == it->type && items[j].remote == it->remote)
                    return fail(HCCL_E_PARA,
                                "%s: items %ld and %ld: two buffers in one direction for one "
                                "peer in one call",
                                sym, (long)j, (long)i);
    }
    return HCCL_SUCCESS;
}

static int in_box(msg_t *const *box, uint64_t seq) {
    for (msg_t *m = *box; m; m = m->next)
        if (m->seq == seq) return 1;
    return 0;
}

/* Runs checked items: posts every send, waits for every receive, then waits until every send
 * has been taken by its receiver. Sends and receives between two ranks match in posting order
 * (FIFO). A send nobody takes in time is withdrawn. Failures found while running are deferred
 * to the stream. */
static HcclResult run_items(const char *sym, comm_t *c, const item_t *items, uint32_t n,
                            void *stream) {
    int code = 0;
    int mode = fake_cann_internal_inject(sym, c->device, &code);
    if (mode == FAKE_FAIL)
        return fail((HcclResult)code, "%s: injected failure (code %ld)", sym, code, 0);
    uint32_t ms = fake_cann_internal_timeout_ms();
    struct timespec dl = deadline_in(ms);
    world_t *w = c->w;
    uint32_t me = c->rank;
    uint64_t posted[n ? n : 1];
    pthread_mutex_lock(&g_mu);
    for (uint32_t i = 0; i < n; i++) {
        const item_t *it = &items[i];
        posted[i] = UINT64_MAX;
        if (it->type != 0) continue;
        size_t bytes = (size_t)it->count * dtype_size(it->dtype);
        msg_t *m = malloc(sizeof *m + bytes);
        if (m == NULL) {
            deferred(c, stream, HCCL_E_INTERNAL);
            continue;
        }
        m->next = NULL;
        m->seq = w->send_seq[me * w->n + it->remote]++;
        m->count = it->count;
        m->dtype = it->dtype;
        m->bytes = bytes;
        if (bytes) memcpy(m->data, it->buf, bytes);
        msg_t **tail = &w->mail[me * w->n + it->remote];
        while (*tail) tail = &(*tail)->next;
        *tail = m;
        posted[i] = m->seq;
    }
    pthread_cond_broadcast(&g_cv);
    int timed_out = 0;
    for (uint32_t i = 0; i < n && !timed_out; i++) {
        const item_t *it = &items[i];
        if (it->type != 1) continue;
        msg_t **box = &w->mail[it->remote * w->n + me];
        while (*box == NULL)
            if (!wait_until(&dl) && *box == NULL) {
                timed_out = 1;
                break;
            }
        if (timed_out) break;
        msg_t *m = *box;
        *box = m->next;
        pthread_cond_broadcast(&g_cv); /* the sender waits for its message to be taken */
        if (mode == FAKE_HANG) { /* the data is lost; the receive waits out the timeout */
            free(m);
            continue;
        }
        if (m->count != it->count || m->dtype != it->dtype) {
            fake_cann_internal_set_msg(
                "%s: rank %u receives %lu elements of type %u from rank %u, which sent %lu of "
                "type %u",
                sym, me, (unsigned long)it->count, it->dtype, it->remote, (unsigned long)m->count,
                m->dtype);
            deferred(c, stream, HCCL_E_PARA);
        } else if (m->bytes) {
            memcpy(it->buf, m->data, m->bytes);
        }
        free(m);
    }
    int unsent = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (posted[i] == UINT64_MAX) continue;
        msg_t **box = &w->mail[me * w->n + items[i].remote];
        while (in_box(box, posted[i]))
            if (!wait_until(&dl) && in_box(box, posted[i])) {
                for (msg_t **pp = box; *pp; pp = &(*pp)->next) {
                    if ((*pp)->seq == posted[i]) { /* withdraw it */
                        msg_t *m = *pp;
                        *pp = m->next;
                        free(m);
                        break;
                    }
                }
                unsent = 1;
                break;
            }
    }
    if (mode == FAKE_HANG) timed_out = 1;
    if (timed_out || unsent) {
        pthread_mutex_unlock(&g_mu);
        if (mode == FAKE_HANG) sleep_ms(ms);
        pthread_mutex_lock(&g_mu);
        fake_cann_internal_set_msg("%s: rank %u: a %s did not complete in %u ms", sym, me,
                                   timed_out ? "receive" : "send", ms);
        deferred(c, stream, HCCL_E_TIMEOUT);
    }
    pthread_mutex_unlock(&g_mu);
    return HCCL_SUCCESS;
}

FAKE_EXPORT HcclResult HcclBatchSendRecv(void *sendRecvInfo, uint32_t itemNum, void *comm,
                                         void *stream) {
    const char *sym = "HcclBatchSendRecv";
    if (t_group) return fail(HCCL_E_NOT_SUPPORT, "%s: not allowed inside a group", sym, 0, 0);
    HcclResult rc = check_items(sym, comm, sendRecvInfo, itemNum, stream, 1);
    if (rc != HCCL_SUCCESS) return rc;
    return run_items(sym, comm, sendRecvInfo, itemNum, stream);
}

static HcclResult one(const char *sym, uint32_t type, void *buf, uint64_t count, uint32_t dtype,
                      uint32_t peer, void *comm, void *stream) {
    item_t it = {type, buf, count, dtype, peer};
    HcclResult rc = check_items(sym, comm, &it, 1, stream, 0);
    if (rc != HCCL_SUCCESS) return rc;
    if (t_group) {
        if (t_nitems > 0 && (t_group_comm != comm || t_group_stream != stream))
            return fail(HCCL_E_NOT_SUPPORT, "%s: one group, one communicator and stream", sym, 0,
                        0);
        if (t_nitems == t_capitems) {
            size_t cap = t_capitems ? t_capitems * 2 : 16;
            item_t *p = realloc(t_items, cap * sizeof *p);
            if (p == NULL) return HCCL_E_INTERNAL;
            t_items = p;
            t_capitems = cap;
        }
        t_items[t_nitems++] = it;
        t_group_comm = comm;
        t_group_stream = stream;
        return HCCL_SUCCESS;
    }
    return run_items(sym, comm, &it, 1, stream);
}

FAKE_EXPORT HcclResult HcclSend(void *sendBuf, uint64_t count, uint32_t dataType, uint32_t destRank,
                                void *comm, void *stream) {
    return one("HcclSend", 0, sendBuf, count, dataType, destRank, comm, stream);
}

FAKE_EXPORT HcclResult HcclRecv(void *recvBuf, uint64_t count, uint32_t dataType, uint32_t srcRank,
                                void *comm, void *stream) {
    return one("HcclRecv", 1, recvBuf, count, dataType, srcRank, comm, stream);
}

FAKE_EXPORT HcclResult HcclGroupStart(void) {
    t_group++;
    return HCCL_SUCCESS;
}

FAKE_EXPORT HcclResult HcclGroupEnd(void) {
    if (t_group == 0) return fail(HCCL_E_PARA, "%s: no group started", "HcclGroupEnd", 0, 0);
    if (--t_group > 0) return HCCL_SUCCESS;
    size_t n = t_nitems;
    t_nitems = 0;
    if (n == 0) return HCCL_SUCCESS;
    return run_items("HcclGroupEnd", t_group_comm, t_items, (uint32_t)n, t_group_stream);
}

/* ---- collectives ---- */

FAKE_EXPORT HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount,
                                     uint32_t dataType, void *comm, void *stream) {
    const char *sym = "HcclAllGather";
    comm_t *c = comm;
    if (!comm_ok(c)) return fail(HCCL_E_PTR, "%s: not a communicator", sym, 0, 0);
    size_t sz = dtype_size(dataType);
    if (sz == 0) return fail(HCCL_E_PARA, "%s: data type %ld", sym, (long)dataType, 0);
    if (!fake_cann_internal_stream_valid(stream))
        return fail(HCCL_E_PARA, "%s: not a live stream", sym, 0, 0);
    world_t *w = c->w;
    size_t bytes = (size_t)sendCount * sz;
    if (sendCount == 0 || sendCount > SIZE_MAX / sz / w->n || sendBuf == NULL || recvBuf == NULL ||
        !fake_cann_internal_is_device(sendBuf, bytes) ||
        !fake_cann_internal_is_device(recvBuf, bytes * w->n))
        return fail(HCCL_E_PARA, "%s: buffers are not device memory of %ld elements per rank",
                    sym, (long)sendCount, 0);
    int code = 0;
    int mode = fake_cann_internal_inject(sym, c->device, &code);
    if (mode == FAKE_FAIL)
        return fail((HcclResult)code, "%s: injected failure (code %ld)", sym, code, 0);
    /* A collective outlasts a point-to-point timeout (twice it, plus 100 ms), as a deployment's
     * agreement should: a rank that failed an exchange early still meets the ranks that wait
     * that exchange out. */
    uint32_t ms = fake_cann_internal_timeout_ms();
    struct timespec dl = deadline_in(ms > (UINT32_MAX - 100) / 2 ? UINT32_MAX : 2 * ms + 100);
    pthread_mutex_lock(&g_mu);
    uint64_t seq = c->coll_seq++;
    round_t *r = w->rounds;
    while (r && r->seq != seq) r = r->next;
    if (r == NULL) {
        r = calloc(1, sizeof *r);
        if (r) r->data = malloc(bytes * w->n);
        if (r == NULL || r->data == NULL) {
            free(r);
            deferred(c, stream, HCCL_E_INTERNAL);
            pthread_mutex_unlock(&g_mu);
            return HCCL_SUCCESS;
        }
        r->seq = seq;
        r->count = sendCount;
        r->dtype = dataType;
        r->next = w->rounds;
        w->rounds = r;
    }
    if (r->count != sendCount || r->dtype != dataType) {
        r->error = HCCL_E_PARA;
    } else {
        memcpy(r->data + (size_t)c->rank * bytes, sendBuf, bytes);
    }
    r->arrived++;
    pthread_cond_broadcast(&g_cv);
    int timed_out = mode == FAKE_HANG;
    while (!timed_out && r->arrived < w->n && r->error == HCCL_SUCCESS)
        if (!wait_until(&dl) && r->arrived < w->n) timed_out = 1;
    HcclResult err = r->error;
    if (!timed_out && err == HCCL_SUCCESS) memcpy(recvBuf, r->data, bytes * w->n);
    r->left++;
    if (r->left == w->n) {
        round_t **pp = &w->rounds;
        while (*pp != r) pp = &(*pp)->next;
        *pp = r->next;
        free(r->data);
        free(r);
    }
    if (timed_out) {
        pthread_mutex_unlock(&g_mu);
        if (mode == FAKE_HANG) sleep_ms(ms);
        pthread_mutex_lock(&g_mu);
        fake_cann_internal_set_msg("%s: rank %u: collective #%lu did not complete in %u ms", sym,
                                   c->rank, (unsigned long)seq, ms);
        deferred(c, stream, HCCL_E_TIMEOUT);
    } else if (err != HCCL_SUCCESS) {
        fake_cann_internal_set_msg("%s: rank %u: ranks disagree on count or type", sym, c->rank);
        deferred(c, stream, err);
    }
    pthread_mutex_unlock(&g_mu);
    return HCCL_SUCCESS;
}
