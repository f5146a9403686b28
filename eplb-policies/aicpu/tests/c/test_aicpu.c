/*
 * test_aicpu.c - the C side of `cargo xtask aicpu`.
 *
 *   test_aicpu [--no-timing] DIR CASE...
 *
 * For each DIR/CASE.case (written by xtask from a golden JSON) and each policy 0..5, runs the
 * call protocol of reference/src/main.rs through eplb_aicpu_rebalance and compares every output
 * byte for byte with DIR/CASE.pK.expected (written by the Rust API on the host: the same files
 * serve the host build and the aarch64 build run under qemu), once each with a version 1 block
 * (248 bytes), a version 2 block (408 bytes) and a version 3 block (432 bytes, no live set),
 * pay-off gate off; then with the gate on, against
 * DIR/CASE.pK.gate.expected (written by the runtime's PolicyHost with the same gate: placement,
 * flags, PAR, the state with the gate's ages, the result and the gate's summary), checking
 * that every layer the gate held keeps its current rows. A difference is reported with the
 * output it is in and its first differing element. Every buffer sits between guard bytes that
 * must be intact after each call. Then times call 1 (best of 5) per policy (not with
 * --no-timing: under an emulator the times mean nothing), prints the buffer sizes of the
 * DeepSeek-V3 shapes, checks that bad arguments give the documented status codes, and runs
 * every policy over a live set (version 3: a dead rank that held an expert's only copy). Exit
 * status 0 only when every check passed.
 *
 * SPDX-License-Identifier: MIT OR Apache-2.0
 */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eplb_aicpu.h"

#if defined(__x86_64__)
#define ARCH "x86_64"
#elif defined(__aarch64__)
#define ARCH "aarch64"
#else
#define ARCH "this platform"
#endif

#define NPOLICIES 6u
#define CALLS 2u
#define GUARD 64u
#define GUARD_BYTE 0xA5u

static const char *const POLICY_NAMES[NPOLICIES] = {
    "random", "default", "swift", "flashlb", "incremental", "deepseek",
};

static unsigned failures;
static unsigned checks;

#define CHECK(cond, ...)                                                                         \
    do {                                                                                         \
        checks++;                                                                                \
        if (!(cond)) {                                                                           \
            failures++;                                                                          \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                 \
            fprintf(stderr, __VA_ARGS__);                                                        \
            fputc('\n', stderr);                                                                 \
        }                                                                                        \
    } while (0)

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/* ---- guarded buffers: GUARD bytes of GUARD_BYTE on each side ---- */

typedef struct {
    unsigned char *base;
    size_t bytes;
} guarded;

static guarded guarded_new(size_t bytes) {
    guarded g;
    g.bytes = bytes;
    g.base = xmalloc(bytes + 2 * GUARD);
    memset(g.base, GUARD_BYTE, GUARD);
    memset(g.base + GUARD, 0, bytes);
    memset(g.base + GUARD + bytes, GUARD_BYTE, GUARD);
    return g;
}

static void *guarded_ptr(const guarded *g) { return g->base + GUARD; }

static int guarded_intact(const guarded *g) {
    for (size_t i = 0; i < GUARD; i++) {
        if (g->base[i] != GUARD_BYTE || g->base[GUARD + g->bytes + i] != GUARD_BYTE) return 0;
    }
    return 1;
}

/* ---- the .case and .expected files ---- */

typedef struct {
    uint64_t layers, experts, ranks, slots, ranks_per_node, groups, seed, windows;
    size_t p, ln;
    uint16_t *current;
    double *loads;
    double *samples;
} test_case;

static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "error: cannot open %s\n", path);
        exit(2);
    }
    if (fseek(f, 0, SEEK_END) != 0) exit(2);
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) exit(2);
    unsigned char *buf = xmalloc((size_t)n);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "error: cannot read %s\n", path);
        exit(2);
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static size_t pad8(size_t n) { return (n + 7u) & ~(size_t)7u; }

typedef struct {
    const unsigned char *buf;
    size_t len, at;
    const char *path;
} reader;

static const unsigned char *take(reader *r, size_t n) {
    if (r->len - r->at < n) {
        fprintf(stderr, "error: %s truncated at byte %zu\n", r->path, r->at);
        exit(2);
    }
    const unsigned char *p = r->buf + r->at;
    r->at += n;
    return p;
}

static uint64_t take_u64(reader *r) {
    uint64_t v;
    memcpy(&v, take(r, 8), 8); /* the files are little-endian, as are x86_64 and aarch64 */
    return v;
}

static test_case load_case(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.case", dir, name);
    size_t len;
    unsigned char *buf = read_file(path, &len);
    reader r = {buf, len, 0, path};
    if (memcmp(take(&r, 8), "EPLBCAS1", 8) != 0) {
        fprintf(stderr, "error: %s is not an EPLBCAS1 file\n", path);
        exit(2);
    }
    test_case c;
    c.layers = take_u64(&r);
    c.experts = take_u64(&r);
    c.ranks = take_u64(&r);
    c.slots = take_u64(&r);
    c.ranks_per_node = take_u64(&r);
    c.groups = take_u64(&r);
    c.seed = take_u64(&r);
    c.windows = take_u64(&r);
    c.p = (size_t)(c.layers * c.ranks * c.slots);
    c.ln = (size_t)(c.layers * c.experts);
    c.current = xmalloc(c.p * 2);
    memcpy(c.current, take(&r, pad8(c.p * 2)), c.p * 2);
    c.loads = xmalloc(c.ln * 8);
    memcpy(c.loads, take(&r, c.ln * 8), c.ln * 8);
    c.samples = xmalloc(c.windows * c.ln * 8);
    memcpy(c.samples, take(&r, c.windows * c.ln * 8), c.windows * c.ln * 8);
    if (r.at != len) {
        fprintf(stderr, "error: %s has trailing bytes\n", path);
        exit(2);
    }
    free(buf);
    return c;
}

/* ---- one set of buffers for a (case, policy) ---- */

typedef struct {
    uint32_t policy;
    uint32_t payoff_gate; /* sizes the scratch and state; args_for does not set the flag */
    uint64_t scratch_words, state_words;
    guarded current, out, changed, before, after, scratch, state;
} buffers;

static uint64_t scratch_len_of(const test_case *c, uint32_t policy, uint32_t gate) {
    uint64_t v2 = eplb_aicpu_scratch_len_v2((uint16_t)c->layers, (uint16_t)c->experts,
                                            (uint16_t)c->ranks, (uint16_t)c->slots,
                                            (uint16_t)c->ranks_per_node, (uint16_t)c->groups,
                                            policy, gate);
    if (!gate)
        CHECK(v2 == eplb_aicpu_scratch_len((uint16_t)c->layers, (uint16_t)c->experts,
                                           (uint16_t)c->ranks, (uint16_t)c->slots,
                                           (uint16_t)c->ranks_per_node, (uint16_t)c->groups,
                                           policy),
              "scratch_len_v2(..., 0) != scratch_len");
    return v2;
}

static uint64_t state_len_of(const test_case *c, uint32_t policy, uint32_t gate) {
    uint64_t v2 = eplb_aicpu_state_len_v2((uint16_t)c->layers, (uint16_t)c->experts,
                                          (uint16_t)c->ranks, (uint16_t)c->slots,
                                          (uint16_t)c->ranks_per_node, (uint16_t)c->groups,
                                          policy, gate);
    if (!gate)
        CHECK(v2 == eplb_aicpu_state_len((uint16_t)c->layers, (uint16_t)c->experts,
                                         (uint16_t)c->ranks, (uint16_t)c->slots,
                                         (uint16_t)c->ranks_per_node, (uint16_t)c->groups,
                                         policy),
              "state_len_v2(..., 0) != state_len");
    return v2;
}

static buffers buffers_for(const test_case *c, uint32_t policy, uint32_t gate) {
    buffers b;
    b.policy = policy;
    b.payoff_gate = gate;
    b.scratch_words = scratch_len_of(c, policy, gate);
    b.state_words = state_len_of(c, policy, gate);
    b.current = guarded_new(c->p * 2);
    memcpy(guarded_ptr(&b.current), c->current, c->p * 2);
    b.out = guarded_new(c->p * 2);
    b.changed = guarded_new((size_t)c->layers);
    b.before = guarded_new((size_t)c->layers * 8);
    b.after = guarded_new((size_t)c->layers * 8);
    b.scratch = guarded_new((size_t)b.scratch_words * 8);
    b.state = guarded_new((size_t)b.state_words * 8);
    return b;
}

static buffers buffers_new(const test_case *c, uint32_t policy) { return buffers_for(c, policy, 0); }

static void buffers_free(buffers *b) {
    guarded *all[] = {&b->current, &b->out, &b->changed, &b->before,
                      &b->after,   &b->scratch, &b->state};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]->base);
}

static int buffers_intact(const buffers *b) {
    const guarded *all[] = {&b->current, &b->out, &b->changed, &b->before,
                            &b->after,   &b->scratch, &b->state};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!guarded_intact(all[i])) return 0;
    return 1;
}

/* Arguments for one call on `b`, every length exactly what the shape needs. */
static eplb_aicpu_args args_for(const test_case *c, buffers *b, uint64_t seed) {
    eplb_aicpu_args a;
    memset(&a, 0, sizeof a);
    a.version = EPLB_AICPU_ABI_VERSION;
    a.struct_size = (uint32_t)sizeof a;
    a.layers = (uint16_t)c->layers;
    a.experts = (uint16_t)c->experts;
    a.ranks = (uint16_t)c->ranks;
    a.slots_per_rank = (uint16_t)c->slots;
    a.ranks_per_node = (uint16_t)c->ranks_per_node;
    a.groups = (uint16_t)c->groups;
    a.policy = b->policy;
    a.seed = seed;
    a.windows = c->windows;
    a.current = guarded_ptr(&b->current);
    a.current_len = c->p;
    a.loads = c->loads;
    a.loads_len = c->ln;
    a.samples = c->windows ? c->samples : NULL;
    a.samples_len = c->windows * c->ln;
    a.out_placement = guarded_ptr(&b->out);
    a.out_placement_len = c->p;
    a.out_changed = guarded_ptr(&b->changed);
    a.out_changed_len = c->layers;
    a.out_par_before = guarded_ptr(&b->before);
    a.out_par_before_len = c->layers;
    a.out_par_after = guarded_ptr(&b->after);
    a.out_par_after_len = c->layers;
    a.scratch = guarded_ptr(&b->scratch);
    a.scratch_len = b->scratch_words;
    a.state = b->state_words ? guarded_ptr(&b->state) : NULL;
    a.state_len = b->state_words;
    return a;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The same arguments as a version 1 block: version 1, struct_size 248; the library must not
 * touch anything beyond. */
static void make_v1(eplb_aicpu_args *a) {
    a->version = 1;
    a->struct_size = EPLB_AICPU_ARGS_V1_SIZE;
}

/* The same arguments as a version 2 block: version 2, struct_size 408. */
static void make_v2(eplb_aicpu_args *a) {
    a->version = 2;
    a->struct_size = EPLB_AICPU_ARGS_V2_SIZE;
}

/* Compares the `n` bytes at `got` with the next `padded` bytes of `r` (an output of `elem`-byte
 * elements, doubles when `is_f64`); on a difference, reports `part` and its first differing
 * element. Returns 1 when equal. */
static unsigned same(reader *r, const void *got, size_t n, size_t padded, size_t elem, int is_f64,
                     const char *what, const char *part) {
    const unsigned char *want = take(r, padded);
    if (memcmp(got, want, n) == 0) return 1;
    size_t i = 0;
    while (((const unsigned char *)got)[i] == want[i]) i++;
    i /= elem;
    if (is_f64) {
        double g, w;
        uint64_t gb, wb;
        memcpy(&g, (const unsigned char *)got + i * 8, 8);
        memcpy(&w, want + i * 8, 8);
        memcpy(&gb, &g, 8);
        memcpy(&wb, &w, 8);
        fprintf(stderr,
                "  %s: %s differs first at [%zu]: C ABI on " ARCH " %.17g (0x%016llx), Rust API "
                "%.17g (0x%016llx)\n",
                what, part, i, g, (unsigned long long)gb, w, (unsigned long long)wb);
    } else {
        uint64_t g = 0, w = 0;
        memcpy(&g, (const unsigned char *)got + i * elem, elem);
        memcpy(&w, want + i * elem, elem);
        fprintf(stderr, "  %s: %s differs first at [%zu]: C ABI on " ARCH " %llu, Rust API %llu\n",
                what, part, i, (unsigned long long)g, (unsigned long long)w);
    }
    return 0;
}

/* Runs the protocol for one (case, policy) with a version `version` block (gate off) and
 * compares with the Rust API's bytes. */
static void golden_policy(const char *dir, const char *name, const test_case *c, uint32_t policy,
                          uint32_t version) {
    const char *pname = POLICY_NAMES[policy];
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.p%u.expected", dir, name, policy);
    size_t len;
    unsigned char *exp = read_file(path, &len);
    reader r = {exp, len, 0, path};
    if (memcmp(take(&r, 8), "EPLBEXP1", 8) != 0) {
        fprintf(stderr, "error: %s is not an EPLBEXP1 file\n", path);
        exit(2);
    }
    uint64_t calls = take_u64(&r), state_words = take_u64(&r);
    buffers b = buffers_new(c, policy);
    CHECK(calls == CALLS, "%s: %llu calls", path, (unsigned long long)calls);
    CHECK(b.scratch_words > 0, "%s %s: scratch_len is 0", name, pname);
    CHECK(state_words == b.state_words, "%s %s: state_len %llu, Rust %llu", name, pname,
          (unsigned long long)b.state_words, (unsigned long long)state_words);
    size_t l = (size_t)c->layers;
    unsigned identical = 0;
    for (uint64_t call = 0; call < CALLS && state_words == b.state_words; call++) {
        eplb_aicpu_args a = args_for(c, &b, c->seed + call);
        if (version == 1) make_v1(&a);
        if (version == 2) make_v2(&a);
        /* Canaries in the version 2 and 3 outputs: a call of an older version must leave them,
         * a call of their version (or a later one) zero them. */
        memset(&a.gate_result, 0x5A, sizeof a.gate_result);
        a.reloads = 0x5A5A5A5A5A5A5A5Aull;
        uint32_t st = eplb_aicpu_rebalance(&a);
        CHECK(st == EPLB_AICPU_OK, "%s %s v%u call %llu: status %u (field %u, detail %llu)", name,
              pname, version, (unsigned long long)call + 1, st, a.result.field,
              (unsigned long long)a.result.detail);
        CHECK(buffers_intact(&b), "%s %s call %llu: a guard byte changed", name, pname,
              (unsigned long long)call + 1);
        {
            unsigned char want[sizeof a.gate_result];
            memset(want, version == 1 ? 0x5A : 0, sizeof want);
            CHECK(memcmp(&a.gate_result, want, sizeof want) == 0,
                  "%s %s v%u: gate_result %s", name, pname, version,
                  version == 1 ? "written by a version 1 call" : "not zeroed (gate off)");
            CHECK(a.reloads == (version < 3 ? 0x5A5A5A5A5A5A5A5Aull : 0), "%s %s v%u: reloads %s",
                  name, pname, version,
                  version < 3 ? "written by an older version's call" : "not zeroed (no live set)");
        }
        char what[128];
        snprintf(what, sizeof what, "%s %s v%u call %llu", name, pname, version,
                 (unsigned long long)call + 1);
        unsigned ok = 1;
        ok &= same(&r, guarded_ptr(&b.out), c->p * 2, pad8(c->p * 2), 2, 0, what, "placement");
        ok &= same(&r, guarded_ptr(&b.changed), l, pad8(l), 1, 0, what, "changed flags");
        ok &= same(&r, guarded_ptr(&b.before), l * 8, l * 8, 8, 1, what, "PAR before");
        ok &= same(&r, guarded_ptr(&b.after), l * 8, l * 8, 8, 1, what, "PAR after");
        ok &= same(&r, guarded_ptr(&b.state), state_words * 8, state_words * 8, 8, 0, what,
                   "state");
        uint64_t counts[3] = {a.result.changed_layers, a.result.colocated_rows, a.result.moves};
        ok &= same(&r, counts, 24, 24, 8, 0, what, "changed layers, co-located rows, moves");
        double hot[4] = {a.result.par_mean_before, a.result.par_max_before,
                         a.result.par_mean_after, a.result.par_max_after};
        ok &= same(&r, hot, 32, 32, 8, 1, what, "mean and max PAR before and after");
        CHECK(ok, "%s: output differs from the Rust API", what);
        identical += ok;
        if (call == 0 && version == EPLB_AICPU_ABI_VERSION)
            printf("  %-26s %-12s changed %2u/%zu layers, moves %6llu, PAR mean %.4f -> %.4f\n",
                   name, pname, a.result.changed_layers, l, (unsigned long long)a.result.moves,
                   a.result.par_mean_before, a.result.par_mean_after);
        /* Call 2 starts from call 1's placement, with call 1's state. */
        memcpy(guarded_ptr(&b.current), guarded_ptr(&b.out), c->p * 2);
    }
    CHECK(identical == CALLS, "%s %s: %u of %u calls identical", name, pname, identical, CALLS);
    CHECK(r.at == len, "%s: trailing bytes", path);
    free(exp);
    buffers_free(&b);
}

/* Runs the protocol for one (case, policy) with the pay-off gate on and compares with the bytes
 * of the runtime's PolicyHost with the same gate (the gate block comes from the file). Returns
 * the layers held back over both calls. */
static unsigned golden_gated(const char *dir, const char *name, const test_case *c,
                             uint32_t policy) {
    const char *pname = POLICY_NAMES[policy];
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.p%u.gate.expected", dir, name, policy);
    size_t len;
    unsigned char *exp = read_file(path, &len);
    reader r = {exp, len, 0, path};
    if (memcmp(take(&r, 8), "EPLBEXG1", 8) != 0) {
        fprintf(stderr, "error: %s is not an EPLBEXG1 file\n", path);
        exit(2);
    }
    uint64_t calls = take_u64(&r), state_words = take_u64(&r);
    eplb_aicpu_gate gate;
    memcpy(&gate, take(&r, sizeof gate), sizeof gate);
    buffers b = buffers_for(c, policy, 1);
    CHECK(calls == CALLS, "%s: %llu calls", path, (unsigned long long)calls);
    CHECK(state_words == b.state_words, "%s %s gated: state_len_v2 %llu, Rust %llu", name, pname,
          (unsigned long long)b.state_words, (unsigned long long)state_words);
    CHECK(b.state_words == state_len_of(c, policy, 0) + c->layers,
          "%s %s: the gate's state is not one word per layer", name, pname);
    CHECK(b.scratch_words > scratch_len_of(c, policy, 0), "%s %s: no gate scratch", name, pname);
    size_t l = (size_t)c->layers, per = c->p / l;
    unsigned identical = 0, held = 0;
    for (uint64_t call = 0; call < CALLS && state_words == b.state_words; call++) {
        eplb_aicpu_args a = args_for(c, &b, c->seed + call);
        a.payoff_gate = 1;
        a.gate = gate;
        uint32_t st = eplb_aicpu_rebalance(&a);
        CHECK(st == EPLB_AICPU_OK, "%s %s gated call %llu: status %u (field %u, detail %llu)",
              name, pname, (unsigned long long)call + 1, st, a.result.field,
              (unsigned long long)a.result.detail);
        CHECK(buffers_intact(&b), "%s %s gated call %llu: a guard byte changed", name, pname,
              (unsigned long long)call + 1);
        char what[128];
        snprintf(what, sizeof what, "%s %s gated call %llu", name, pname,
                 (unsigned long long)call + 1);
        unsigned ok = 1;
        ok &= same(&r, guarded_ptr(&b.out), c->p * 2, pad8(c->p * 2), 2, 0, what, "placement");
        ok &= same(&r, guarded_ptr(&b.changed), l, pad8(l), 1, 0, what, "changed flags");
        ok &= same(&r, guarded_ptr(&b.before), l * 8, l * 8, 8, 1, what, "PAR before");
        ok &= same(&r, guarded_ptr(&b.after), l * 8, l * 8, 8, 1, what, "PAR after");
        ok &= same(&r, guarded_ptr(&b.state), state_words * 8, state_words * 8, 8, 0, what,
                   "state (policy words, then the gate's ages)");
        uint64_t counts[3] = {a.result.changed_layers, a.result.colocated_rows, a.result.moves};
        ok &= same(&r, counts, 24, 24, 8, 0, what, "changed layers, co-located rows, moves");
        double hot[4] = {a.result.par_mean_before, a.result.par_max_before,
                         a.result.par_mean_after, a.result.par_max_after};
        ok &= same(&r, hot, 32, 32, 8, 1, what, "mean and max PAR before and after");
        uint64_t gcounts[3] = {a.gate_result.changed_layers, a.gate_result.moved_layers,
                               a.gate_result.held_layers};
        ok &= same(&r, gcounts, 24, 24, 8, 0, what, "gate: changed, moved, held layers");
        double gtimes[3] = {a.gate_result.saving_ms_per_iter, a.gate_result.stall_ms,
                            a.gate_result.forgone_ms_per_iter};
        ok &= same(&r, gtimes, 24, 24, 8, 1, what, "gate: saving, stall, forgone");
        CHECK(ok, "%s: output differs from the runtime's PolicyHost", what);
        identical += ok;
        CHECK(a.gate_result.moved_layers + a.gate_result.held_layers ==
                      a.gate_result.changed_layers &&
                  a.gate_result.moved_layers == a.result.changed_layers,
              "%s: gate counts %u + %u != %u (result %u)", what, a.gate_result.moved_layers,
              a.gate_result.held_layers, a.gate_result.changed_layers, a.result.changed_layers);
        /* Every layer not flagged changed (held, or left alone) keeps its current rows. */
        const uint16_t *cur = guarded_ptr(&b.current), *out = guarded_ptr(&b.out);
        const uint8_t *flags = guarded_ptr(&b.changed);
        for (size_t k = 0; k < l; k++)
            if (!flags[k])
                CHECK(memcmp(cur + k * per, out + k * per, per * 2) == 0,
                      "%s: layer %zu not changed but its rows differ", what, k);
        held += a.gate_result.held_layers;
        if (call == 0)
            printf("  %-26s %-12s gated: changed %2u, moved %2u, held %2u, saving %.4f ms/iter, "
                   "stall %.3f ms\n",
                   name, pname, a.gate_result.changed_layers, a.gate_result.moved_layers,
                   a.gate_result.held_layers, a.gate_result.saving_ms_per_iter,
                   a.gate_result.stall_ms);
        memcpy(guarded_ptr(&b.current), guarded_ptr(&b.out), c->p * 2);
    }
    CHECK(identical == CALLS, "%s %s gated: %u of %u calls identical", name, pname, identical,
          CALLS);
    CHECK(r.at == len, "%s: trailing bytes", path);
    free(exp);
    buffers_free(&b);
    return held;
}

/* A gate block: DeepSeek-V3 W8A8 decode on A3 (docs/time-model.md), H = 600, A = 50. */
static eplb_aicpu_gate a3_dsv3_gate(void) {
    eplb_aicpu_gate g;
    memset(&g, 0, sizeof g);
    g.flops_bf16 = 376e12;
    g.flops_8bit = 752e12;
    g.hbm_bytes_per_s = 1.6e12;
    g.intra_node_bytes_per_s = 196e9;
    g.inter_node_bytes_per_s = 25e9;
    g.layer_overhead_ms = 0.1;
    g.collective_ms = 0.1;
    g.hidden = 7168;
    g.intermediate = 2048;
    g.top_k = 8;
    g.shared_experts = 1;
    g.dtype = EPLB_AICPU_DTYPE_INT8;
    g.tokens_per_rank = 128;
    g.expert_bytes = 44085248;
    g.heat_interval = 600;
    g.algo_interval = 50;
    return g;
}

/* Best of 5 of call 1 (fresh state each time, reset outside the timed region), with the
 * pay-off gate when `gate` is 1. */
static double time_policy(const test_case *c, uint32_t policy, uint32_t gate) {
    buffers b = buffers_for(c, policy, gate);
    double best = INFINITY;
    for (int rep = 0; rep < 5; rep++) {
        memset(guarded_ptr(&b.state), 0, (size_t)b.state_words * 8);
        eplb_aicpu_args a = args_for(c, &b, c->seed);
        a.payoff_gate = gate;
        a.gate = a3_dsv3_gate();
        double t0 = now_ms();
        uint32_t st = eplb_aicpu_rebalance(&a);
        double t = now_ms() - t0;
        CHECK(st == EPLB_AICPU_OK, "timing %s: status %u", POLICY_NAMES[policy], st);
        if (t < best) best = t;
    }
    buffers_free(&b);
    return best;
}

/* ---- bad arguments ---- */

/* Expects `status`, and when `field` is not ~0u, that result.field == field. */
static void expect(const char *what, eplb_aicpu_args *a, uint32_t status, uint32_t field) {
    uint32_t st = eplb_aicpu_rebalance(a);
    CHECK(st == status, "bad args [%s]: status %u, expected %u", what, st, status);
    if (field != ~0u)
        CHECK(a->result.field == field, "bad args [%s]: field %u, expected %u", what,
              a->result.field, field);
    printf("  %-52s -> status %2u field %2u detail %llu\n", what, st, a->result.field,
           (unsigned long long)a->result.detail);
}

static void bad_arguments(const test_case *c) {
    printf("bad arguments (on %llu x %llu x %llu x %llu):\n", (unsigned long long)c->layers,
           (unsigned long long)c->experts, (unsigned long long)c->ranks,
           (unsigned long long)c->slots);
    buffers d = buffers_new(c, EPLB_AICPU_POLICY_DEFAULT);
    buffers f = buffers_new(c, EPLB_AICPU_POLICY_FLASHLB);
    eplb_aicpu_args a;
    size_t l = (size_t)c->layers;

    /* 1. null args */
    CHECK(eplb_aicpu_rebalance(NULL) == EPLB_AICPU_E_NULL_ARGS, "null args");
    printf("  %-52s -> status %2u\n", "null args", EPLB_AICPU_E_NULL_ARGS);

    /* 2. version and struct size: nothing written */
    a = args_for(c, &d, 1);
    a.version = 4;
    a.result.detail = 12345;
    expect("version 4", &a, EPLB_AICPU_E_VERSION, ~0u);
    CHECK(a.result.detail == 12345, "version mismatch wrote the result");
    a = args_for(c, &d, 1);
    a.struct_size = (uint32_t)sizeof a - 8;
    expect("struct_size - 8", &a, EPLB_AICPU_E_VERSION, ~0u);
    a = args_for(c, &d, 1);
    a.struct_size = EPLB_AICPU_ARGS_V1_SIZE;
    expect("version 3 with the version 1 size", &a, EPLB_AICPU_E_VERSION, ~0u);
    a = args_for(c, &d, 1);
    a.struct_size = EPLB_AICPU_ARGS_V2_SIZE;
    expect("version 3 with the version 2 size", &a, EPLB_AICPU_E_VERSION, ~0u);
    a = args_for(c, &d, 1);
    a.version = 2;
    expect("version 2 with the version 3 size", &a, EPLB_AICPU_E_VERSION, ~0u);
    a = args_for(c, &d, 1);
    a.version = 1;
    expect("version 1 with the version 3 size", &a, EPLB_AICPU_E_VERSION, ~0u);
    a = args_for(c, &d, 1);
    make_v2(&a);
    a.live = (const uint8_t *)(uintptr_t)8; /* beyond a version 2 block: never read */
    a.live_len = 1;
    a.reloads = 77;
    expect("version 2 block, garbage after its 408 bytes", &a, EPLB_AICPU_OK, ~0u);
    CHECK(a.reloads == 77, "a version 2 call wrote reloads");
    a = args_for(c, &d, 1);
    make_v1(&a);
    a.payoff_gate = 7; /* beyond a version 1 block: never read */
    expect("version 1 block, garbage after its 248 bytes", &a, EPLB_AICPU_OK, ~0u);

    /* 3. misaligned args */
    {
        unsigned char *raw = xmalloc(sizeof a + 16);
        a = args_for(c, &d, 1);
        memcpy(raw + 4, &a, sizeof a);
        CHECK(eplb_aicpu_rebalance(raw + 4) == EPLB_AICPU_E_MISALIGNED, "misaligned args");
        printf("  %-52s -> status %2u\n", "args at an address = 4 mod 8", EPLB_AICPU_E_MISALIGNED);
        free(raw);
    }

    /* 4. null pointer fields */
#define NULLED(field, id)                                                                        \
    do {                                                                                         \
        a = args_for(c, &d, 1);                                                                  \
        a.field = NULL;                                                                          \
        expect("null " #field, &a, EPLB_AICPU_E_NULL_POINTER, id);                               \
    } while (0)
    NULLED(current, EPLB_AICPU_FIELD_CURRENT);
    NULLED(loads, EPLB_AICPU_FIELD_LOADS);
    NULLED(out_placement, EPLB_AICPU_FIELD_OUT_PLACEMENT);
    NULLED(out_changed, EPLB_AICPU_FIELD_OUT_CHANGED);
    NULLED(out_par_before, EPLB_AICPU_FIELD_OUT_PAR_BEFORE);
    NULLED(out_par_after, EPLB_AICPU_FIELD_OUT_PAR_AFTER);
    NULLED(scratch, EPLB_AICPU_FIELD_SCRATCH);
    a = args_for(c, &f, 1);
    a.state = NULL;
    expect("null state (flashlb keeps state)", &a, EPLB_AICPU_E_NULL_POINTER,
           EPLB_AICPU_FIELD_STATE);
    a = args_for(c, &d, 1);
    a.windows = 1;
    a.samples = NULL;
    a.samples_len = c->ln;
    expect("null samples with windows = 1", &a, EPLB_AICPU_E_NULL_POINTER,
           EPLB_AICPU_FIELD_SAMPLES);

    /* 5. misaligned buffers */
    a = args_for(c, &d, 1);
    a.loads = (const double *)((const unsigned char *)c->loads + 4);
    expect("loads at an address = 4 mod 8", &a, EPLB_AICPU_E_MISALIGNED, EPLB_AICPU_FIELD_LOADS);
    a = args_for(c, &d, 1);
    a.current = (const uint16_t *)((const unsigned char *)guarded_ptr(&d.current) + 1);
    expect("current at an odd address", &a, EPLB_AICPU_E_MISALIGNED, EPLB_AICPU_FIELD_CURRENT);
    a = args_for(c, &d, 1);
    a.scratch = (uint64_t *)((unsigned char *)guarded_ptr(&d.scratch) + 4);
    a.scratch_len = d.scratch_words - 1;
    expect("scratch at an address = 4 mod 8", &a, EPLB_AICPU_E_MISALIGNED,
           EPLB_AICPU_FIELD_SCRATCH);
    a = args_for(c, &d, 1);
    a.out_par_after = (double *)((unsigned char *)guarded_ptr(&d.after) + 2);
    a.out_par_after_len = l - 1;
    expect("out_par_after at an address = 2 mod 8", &a, EPLB_AICPU_E_MISALIGNED,
           EPLB_AICPU_FIELD_OUT_PAR_AFTER);

    /* 6. too-short buffers */
#define SHORT(field, id, needed)                                                                 \
    do {                                                                                         \
        a = args_for(c, &d, 1);                                                                  \
        a.field##_len = (needed) - 1;                                                            \
        expect(#field "_len one short", &a, EPLB_AICPU_E_TOO_SHORT, id);                         \
        CHECK(a.result.detail == (needed), #field ": detail %llu",                               \
              (unsigned long long)a.result.detail);                                              \
    } while (0)
    SHORT(current, EPLB_AICPU_FIELD_CURRENT, c->p);
    SHORT(loads, EPLB_AICPU_FIELD_LOADS, c->ln);
    SHORT(out_placement, EPLB_AICPU_FIELD_OUT_PLACEMENT, c->p);
    SHORT(out_changed, EPLB_AICPU_FIELD_OUT_CHANGED, l);
    SHORT(out_par_before, EPLB_AICPU_FIELD_OUT_PAR_BEFORE, l);
    SHORT(out_par_after, EPLB_AICPU_FIELD_OUT_PAR_AFTER, l);
    a = args_for(c, &d, 1);
    a.windows = 2;
    a.samples = c->loads;
    a.samples_len = c->ln;
    expect("samples_len < windows * L * N", &a, EPLB_AICPU_E_TOO_SHORT, EPLB_AICPU_FIELD_SAMPLES);
    a = args_for(c, &d, 1);
    a.windows = UINT64_MAX;
    a.samples = c->loads;
    a.samples_len = c->ln;
    expect("windows = 2^64 - 1 (overflows)", &a, EPLB_AICPU_E_TOO_SHORT,
           EPLB_AICPU_FIELD_SAMPLES);

    /* 7. scratch and state too small; longer buffers than needed are fine */
    a = args_for(c, &d, 1);
    a.scratch_len = d.scratch_words - 1;
    expect("scratch one word short", &a, EPLB_AICPU_E_SCRATCH, EPLB_AICPU_FIELD_SCRATCH);
    CHECK(a.result.detail == d.scratch_words, "scratch detail");
    a = args_for(c, &f, 1);
    a.state_len = f.state_words - 1;
    expect("state one word short (flashlb)", &a, EPLB_AICPU_E_STATE, EPLB_AICPU_FIELD_STATE);
    CHECK(a.result.detail == f.state_words, "state detail");
    {
        buffers i = buffers_new(c, EPLB_AICPU_POLICY_INCREMENTAL);
        a = args_for(c, &i, 1);
        a.state_len = 0;
        expect("state_len 0 (incremental)", &a,
               i.state_words ? EPLB_AICPU_E_STATE : EPLB_AICPU_OK, ~0u);
        buffers_free(&i);
    }

    /* Lengths beyond what the shape needs are fine, and only the needed elements are written
     * (the extra elements lie in the guard bytes, checked below). */
    a = args_for(c, &d, 1);
    a.out_placement_len += 8;
    a.out_changed_len += 8;
    a.out_par_before_len += 2;
    a.out_par_after_len += 2;
    a.scratch_len += 2;
    a.current_len += 8;
    expect("every length longer than needed", &a, EPLB_AICPU_OK, ~0u);

    /* 8. invalid shapes */
#define SHAPE(what, stmt)                                                                        \
    do {                                                                                         \
        a = args_for(c, &d, 1);                                                                  \
        stmt;                                                                                    \
        expect("shape: " what, &a, EPLB_AICPU_E_SHAPE, EPLB_AICPU_FIELD_SHAPE);                  \
    } while (0)
    SHAPE("layers = 0", a.layers = 0);
    SHAPE("slots per rank > experts", a.slots_per_rank = (uint16_t)(a.experts + 1));
    SHAPE("ranks * slots < experts", a.experts = (uint16_t)(a.ranks * a.slots_per_rank + 1));
    SHAPE("ranks_per_node does not divide ranks", a.ranks_per_node = (uint16_t)(a.ranks + 1));
    SHAPE("groups > experts", a.groups = (uint16_t)(a.experts + 1));

    /* 9. unknown policy */
    a = args_for(c, &d, 1);
    a.policy = 6;
    expect("policy 6", &a, EPLB_AICPU_E_POLICY, EPLB_AICPU_FIELD_POLICY);
    CHECK(a.result.detail == 6, "policy detail");
    a = args_for(c, &d, 1);
    a.policy = UINT32_MAX;
    expect("policy 2^32 - 1", &a, EPLB_AICPU_E_POLICY, EPLB_AICPU_FIELD_POLICY);

    /* 10. bad loads and samples */
    {
        double *bad = xmalloc(c->ln * 8);
        const double values[3] = {NAN, -1.0, INFINITY};
        const char *names[3] = {"NaN load at [3][7]", "negative load at [3][7]",
                                "infinite load at [3][7]"};
        size_t at = 3 * (size_t)c->experts + 7;
        for (int k = 0; k < 3; k++) {
            memcpy(bad, c->loads, c->ln * 8);
            bad[at] = values[k];
            a = args_for(c, &d, 1);
            a.loads = bad;
            expect(names[k], &a, EPLB_AICPU_E_LOAD, EPLB_AICPU_FIELD_LOADS);
            CHECK(a.result.detail == at, "load detail %llu", (unsigned long long)a.result.detail);
        }
        memcpy(bad, c->loads, c->ln * 8);
        bad[at] = NAN;
        a = args_for(c, &f, 1);
        a.windows = 1;
        a.samples = bad;
        a.samples_len = c->ln;
        expect("NaN sample at [0][3][7]", &a, EPLB_AICPU_E_LOAD, EPLB_AICPU_FIELD_SAMPLES);
        free(bad);
    }

    /* 11. invalid current placement */
    {
        uint16_t *cur = guarded_ptr(&d.current);
        uint16_t keep = cur[2 * (c->p / l) + 5];
        cur[2 * (c->p / l) + 5] = (uint16_t)c->experts;
        a = args_for(c, &d, 1);
        expect("current: expert id N in layer 2", &a, EPLB_AICPU_E_PLACEMENT,
               EPLB_AICPU_FIELD_CURRENT);
        CHECK(a.result.detail == 2, "placement detail %llu", (unsigned long long)a.result.detail);
        cur[2 * (c->p / l) + 5] = keep;
    }

    /* 12. overlapping buffers */
    a = args_for(c, &d, 1);
    a.out_par_after = a.out_par_before;
    expect("out_par_after = out_par_before", &a, EPLB_AICPU_E_OVERLAP, ~0u);
    a = args_for(c, &d, 1);
    a.out_placement = (uint16_t *)a.scratch;
    expect("out_placement inside scratch", &a, EPLB_AICPU_E_OVERLAP, ~0u);
    a = args_for(c, &d, 1);
    a.out_par_before = (double *)a.loads;
    expect("out_par_before inside loads", &a, EPLB_AICPU_E_OVERLAP, ~0u);
    a = args_for(c, &d, 1);
    a.out_changed = (uint8_t *)&a + 200;
    a.out_changed_len = l;
    expect("out_changed inside the args struct", &a, EPLB_AICPU_E_OVERLAP, ~0u);
    a = args_for(c, &d, 1);
    a.samples = c->loads; /* inputs may share memory */
    a.windows = 1;
    a.samples_len = c->ln;
    expect("samples = loads (read-only overlap is fine)", &a, EPLB_AICPU_OK, ~0u);

    /* 13. a topology the policy cannot use: deepseek hierarchical with N % groups != 0 */
    {
        test_case t;
        memset(&t, 0, sizeof t);
        t.layers = 1;
        t.experts = 10;
        t.ranks = 4;
        t.slots = 3;
        t.ranks_per_node = 2;
        t.groups = 4;
        t.p = 12;
        t.ln = 10;
        uint16_t cur[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1};
        double loads[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
        t.current = cur;
        t.loads = loads;
        buffers s = buffers_new(&t, EPLB_AICPU_POLICY_DEEPSEEK);
        a = args_for(&t, &s, 1);
        expect("deepseek, 2 nodes, 4 groups, N = 10", &a, EPLB_AICPU_E_TOPOLOGY,
               EPLB_AICPU_FIELD_SHAPE);
        buffers_free(&s);
    }

    /* 14. the pay-off gate's inputs (version 2) */
    {
        buffers g = buffers_for(c, EPLB_AICPU_POLICY_DEFAULT, 1);
        eplb_aicpu_gate ok = a3_dsv3_gate();
        a = args_for(c, &g, 1);
        a.payoff_gate = 1;
        a.gate = ok;
        expect("gate on, valid inputs", &a, EPLB_AICPU_OK, ~0u);
        CHECK(a.gate_result.moved_layers + a.gate_result.held_layers ==
                  a.gate_result.changed_layers,
              "gate counts");
        a = args_for(c, &g, 1);
        a.payoff_gate = 2;
        a.gate = ok;
        expect("payoff_gate = 2", &a, EPLB_AICPU_E_GATE, EPLB_AICPU_FIELD_PAYOFF_GATE);
        CHECK(a.result.detail == 2, "payoff_gate detail");
#define BADGATE(what, stmt, id)                                                                  \
    do {                                                                                         \
        a = args_for(c, &g, 1);                                                                  \
        a.payoff_gate = 1;                                                                       \
        a.gate = ok;                                                                             \
        stmt;                                                                                    \
        expect("gate: " what, &a, EPLB_AICPU_E_GATE, id);                                        \
    } while (0)
        BADGATE("flops_bf16 NaN", a.gate.flops_bf16 = NAN, EPLB_AICPU_FIELD_GATE_FLOPS_BF16);
        {
            double nan = NAN;
            uint64_t bits;
            memcpy(&bits, &nan, 8);
            CHECK(a.result.detail == bits, "NaN detail is its bits");
        }
        BADGATE("flops_8bit 0", a.gate.flops_8bit = 0, EPLB_AICPU_FIELD_GATE_FLOPS_8BIT);
        BADGATE("flops_fp4 -1", a.gate.flops_fp4 = -1, EPLB_AICPU_FIELD_GATE_FLOPS_FP4);
        BADGATE("hbm -1", a.gate.hbm_bytes_per_s = -1, EPLB_AICPU_FIELD_GATE_HBM);
        BADGATE("intra-node bandwidth 0", a.gate.intra_node_bytes_per_s = 0,
                EPLB_AICPU_FIELD_GATE_INTRA_NODE);
        BADGATE("inter-node bandwidth +inf", a.gate.inter_node_bytes_per_s = INFINITY,
                EPLB_AICPU_FIELD_GATE_INTER_NODE);
        BADGATE("layer overhead -0.1", a.gate.layer_overhead_ms = -0.1,
                EPLB_AICPU_FIELD_GATE_LAYER_OVERHEAD);
        BADGATE("collective NaN", a.gate.collective_ms = NAN, EPLB_AICPU_FIELD_GATE_COLLECTIVE);
        BADGATE("hidden 0", a.gate.hidden = 0, EPLB_AICPU_FIELD_GATE_HIDDEN);
        BADGATE("intermediate 0", a.gate.intermediate = 0, EPLB_AICPU_FIELD_GATE_INTERMEDIATE);
        BADGATE("top_k 0", a.gate.top_k = 0, EPLB_AICPU_FIELD_GATE_TOP_K);
        BADGATE("top_k > N", a.gate.top_k = (uint16_t)(c->experts + 1),
                EPLB_AICPU_FIELD_GATE_TOP_K);
        BADGATE("dtype 4", a.gate.dtype = 4, EPLB_AICPU_FIELD_GATE_DTYPE);
        BADGATE("routing 2", a.gate.routing = 2, EPLB_AICPU_FIELD_GATE_ROUTING);
        BADGATE("tokens_per_rank 0", a.gate.tokens_per_rank = 0,
                EPLB_AICPU_FIELD_GATE_TOKENS_PER_RANK);
        BADGATE("expert_bytes -1", a.gate.expert_bytes = -1, EPLB_AICPU_FIELD_GATE_EXPERT_BYTES);
        BADGATE("both intervals 0", (a.gate.heat_interval = 0, a.gate.algo_interval = 0),
                EPLB_AICPU_FIELD_GATE_INTERVALS);
        /* With the gate on, the gate-off sizes are too small. */
        a = args_for(c, &g, 1);
        a.payoff_gate = 1;
        a.gate = ok;
        a.state_len = g.state_words - 1;
        expect("gate on, state one word short", &a, EPLB_AICPU_E_STATE, EPLB_AICPU_FIELD_STATE);
        CHECK(a.result.detail == g.state_words, "gate state detail");
        a = args_for(c, &g, 1);
        a.payoff_gate = 1;
        a.gate = ok;
        a.scratch_len = d.scratch_words;
        expect("gate on, the gate-off scratch", &a, EPLB_AICPU_E_SCRATCH,
               EPLB_AICPU_FIELD_SCRATCH);
        CHECK(a.result.detail == g.scratch_words, "gate scratch detail");
        /* A bad gate block is not read with the gate off. */
        a = args_for(c, &d, 1);
        a.gate.hbm_bytes_per_s = NAN;
        expect("gate off, garbage gate block", &a, EPLB_AICPU_OK, ~0u);
        CHECK(buffers_intact(&g), "gate: a guard byte changed");
        buffers_free(&g);
    }

    /* 15. sizing functions on invalid input */
    CHECK(eplb_aicpu_scratch_len(0, 256, 32, 9, 8, 8, 1) == 0, "scratch_len of L = 0");
    CHECK(eplb_aicpu_scratch_len(58, 256, 32, 9, 8, 8, 6) == 0, "scratch_len of policy 6");
    CHECK(eplb_aicpu_state_len(58, 256, 32, 9, 7, 8, 3) == 0, "state_len of 32 %% 7 != 0");
    CHECK(eplb_aicpu_scratch_len(58, 256, 32, 9, 0, 0, 1) > 0, "0 = default topology");
    CHECK(eplb_aicpu_scratch_len_v2(58, 256, 32, 9, 8, 8, 1, 2) == 0, "scratch_len_v2 of flag 2");
    CHECK(eplb_aicpu_state_len_v2(58, 256, 32, 9, 8, 8, 1, 1) == 58, "state_len_v2: 58 ages");
    printf("  %-52s -> 0\n", "sizing functions on invalid shape or policy");

    CHECK(buffers_intact(&d) && buffers_intact(&f), "bad arguments: a guard byte changed");
    buffers_free(&d);
    buffers_free(&f);
}

/* ---- a live set (version 3) ---- */

/* 1 layer, 4 experts, 3 ranks x 2 slots: rank 1 held the only copies of experts 2 and 3 and is
 * gone (its slots EMPTY). Every policy must put 2 and 3 on the live ranks 0 and 2, leave rank 1
 * EMPTY, and count 2 reloads (the live ranks have exactly 4 slots: one copy each). */
static void live_set(void) {
    const uint16_t E = (uint16_t)EPLB_AICPU_EMPTY;
    uint16_t current[6] = {0, 1, E, E, 0, 1};
    uint8_t live[3] = {1, 0, 1};
    double loads[4] = {4.0, 3.0, 2.0, 1.0};
    printf("a live set (version 3): rank 1 of 3 gone, experts 2 and 3 had their only copy on it\n");
    for (uint32_t p = 0; p < NPOLICIES; p++) {
        uint64_t sw = eplb_aicpu_scratch_len_v3(1, 4, 3, 2, 0, 0, p, 0, 1);
        uint64_t tw = eplb_aicpu_state_len_v3(1, 4, 3, 2, 0, 0, p, 0, 1);
        CHECK(sw > 0 && sw >= eplb_aicpu_scratch_len_v2(1, 4, 3, 2, 0, 0, p, 0),
              "%s: scratch_len_v3 %llu", POLICY_NAMES[p], (unsigned long long)sw);
        CHECK(eplb_aicpu_scratch_len_v3(1, 4, 3, 2, 0, 0, p, 0, 0) ==
                  eplb_aicpu_scratch_len_v2(1, 4, 3, 2, 0, 0, p, 0),
              "%s: scratch_len_v3(..., 0) != scratch_len_v2", POLICY_NAMES[p]);
        uint64_t *scratch = xmalloc((size_t)sw * 8);
        uint64_t *state = tw ? calloc((size_t)tw, 8) : NULL;
        uint16_t out[6];
        uint8_t changed[1];
        double before[1], after[1];
        eplb_aicpu_args a;
        memset(&a, 0, sizeof a);
        a.version = EPLB_AICPU_ABI_VERSION;
        a.struct_size = (uint32_t)sizeof a;
        a.layers = 1;
        a.experts = 4;
        a.ranks = 3;
        a.slots_per_rank = 2;
        a.policy = p;
        a.seed = 1;
        a.current = current;
        a.current_len = 6;
        a.loads = loads;
        a.loads_len = 4;
        a.out_placement = out;
        a.out_placement_len = 6;
        a.out_changed = changed;
        a.out_changed_len = 1;
        a.out_par_before = before;
        a.out_par_before_len = 1;
        a.out_par_after = after;
        a.out_par_after_len = 1;
        a.scratch = scratch;
        a.scratch_len = sw;
        a.state = state;
        a.state_len = tw;
        a.live = live;
        a.live_len = 3;
        uint32_t st = eplb_aicpu_rebalance(&a);
        CHECK(st == EPLB_AICPU_OK, "live set %s: status %u (field %u, detail %llu)",
              POLICY_NAMES[p], st, a.result.field, (unsigned long long)a.result.detail);
        CHECK(out[2] == E && out[3] == E, "live set %s: dead rank 1 holds %u %u", POLICY_NAMES[p],
              out[2], out[3]);
        for (uint16_t e = 0; e < 4; e++)
            CHECK(out[0] == e || out[1] == e || out[4] == e || out[5] == e,
                  "live set %s: expert %u not on a live rank", POLICY_NAMES[p], e);
        CHECK(a.reloads == 2, "live set %s: reloads %llu, expected 2", POLICY_NAMES[p],
              (unsigned long long)a.reloads);
        CHECK(changed[0] == 1, "live set %s: layer not marked changed", POLICY_NAMES[p]);
        printf("  %-12s -> {%u %u | EMPTY EMPTY | %u %u}, reloads %llu, moves %llu, PAR %.4f -> "
               "%.4f\n",
               POLICY_NAMES[p], out[0], out[1], out[4], out[5], (unsigned long long)a.reloads,
               (unsigned long long)a.result.moves, before[0], after[0]);
        if (p == EPLB_AICPU_POLICY_DEFAULT) {
            /* Bad live sets give their status. */
            live[2] = 2;
            expect("live byte 2 on rank 2", &a, EPLB_AICPU_E_LIVE, EPLB_AICPU_FIELD_LIVE);
            CHECK(a.result.detail == 2, "live byte: detail %llu", (unsigned long long)a.result.detail);
            live[2] = 0;
            expect("one live rank: 2 slots for 4 experts", &a, EPLB_AICPU_E_LIVE,
                   EPLB_AICPU_FIELD_LIVE);
            live[2] = 1;
            a.live_len = 2;
            expect("live_len 2 of 3 ranks", &a, EPLB_AICPU_E_TOO_SHORT, EPLB_AICPU_FIELD_LIVE);
            a.live_len = 3;
            current[2] = 2;
            expect("a dead rank holding expert 2", &a, EPLB_AICPU_E_PLACEMENT,
                   EPLB_AICPU_FIELD_CURRENT);
            current[2] = E;
            a.live = NULL;
            expect("EMPTY without a live set", &a, EPLB_AICPU_E_PLACEMENT,
                   EPLB_AICPU_FIELD_CURRENT);
            a.live = live;
            a.payoff_gate = 1;
            expect("live set with the pay-off gate", &a, EPLB_AICPU_E_LIVE,
                   EPLB_AICPU_FIELD_PAYOFF_GATE);
            a.payoff_gate = 0;
            CHECK(eplb_aicpu_rebalance(&a) == EPLB_AICPU_OK, "live set after the bad ones");
        }
        free(scratch);
        free(state);
    }
}

static void memory_table(void) {
    /* DeepSeek-V3: 58 MoE layers x 256 experts, 8 groups; EP32 (9 slots, 4 nodes, 288 slots)
     * and EP64 (5 slots, 8 nodes, 320 slots). */
    const uint16_t shapes[2][4] = {{32, 9, 8, 8}, {64, 5, 8, 8}};
    for (int s = 0; s < 2; s++) {
        uint16_t r = shapes[s][0], sl = shapes[s][1], rpn = shapes[s][2], g = shapes[s][3];
        printf("memory, 58 layers x 256 experts x %u ranks x %u slots (%u slots/layer):\n", r, sl,
               r * sl);
        for (uint32_t p = 0; p < NPOLICIES; p++) {
            uint64_t sc = eplb_aicpu_scratch_len(58, 256, r, sl, rpn, g, p);
            uint64_t st = eplb_aicpu_state_len(58, 256, r, sl, rpn, g, p);
            uint64_t gsc = eplb_aicpu_scratch_len_v2(58, 256, r, sl, rpn, g, p, 1) - sc;
            uint64_t gst = eplb_aicpu_state_len_v2(58, 256, r, sl, rpn, g, p, 1) - st;
            uint64_t lsc = eplb_aicpu_scratch_len_v3(58, 256, r, sl, rpn, g, p, 0, 1) - sc;
            CHECK(eplb_aicpu_state_len_v3(58, 256, r, sl, rpn, g, p, 0, 1) == st,
                  "live state != state");
            printf("  %-12s scratch %8llu B  state %8llu B  total %8llu B (%.1f KiB); "
                   "gate +%llu B scratch, +%llu B state; live set +%llu B scratch\n",
                   POLICY_NAMES[p], (unsigned long long)sc * 8, (unsigned long long)st * 8,
                   (unsigned long long)(sc + st) * 8, (double)(sc + st) * 8.0 / 1024.0,
                   (unsigned long long)gsc * 8, (unsigned long long)gst * 8,
                   (unsigned long long)lsc * 8);
        }
    }
}

int main(int argc, char **argv) {
    int timing = !(argc > 1 && strcmp(argv[1], "--no-timing") == 0);
    if (!timing) {
        argc--;
        argv++;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: test_aicpu [--no-timing] DIR CASE...\n");
        return 2;
    }
    CHECK(eplb_aicpu_abi_version() == EPLB_AICPU_ABI_VERSION, "library ABI version %u",
          eplb_aicpu_abi_version());
    const char *dir = argv[1];
    int ncases = argc - 2;
    test_case *cases = xmalloc(sizeof(test_case) * (size_t)ncases);
    printf("golden cases, C ABI on " ARCH " vs Rust API (2 calls each, byte for byte, ABI v1 "
           "v2 and v3):\n");
    for (int i = 0; i < ncases; i++) {
        cases[i] = load_case(dir, argv[2 + i]);
        for (uint32_t p = 0; p < NPOLICIES; p++) {
            golden_policy(dir, argv[2 + i], &cases[i], p, 1);
            golden_policy(dir, argv[2 + i], &cases[i], p, 2);
            golden_policy(dir, argv[2 + i], &cases[i], p, EPLB_AICPU_ABI_VERSION);
        }
    }
    printf("golden cases with the pay-off gate, C ABI on " ARCH " vs the runtime's PolicyHost "
           "(2 calls each, byte for byte):\n");
    unsigned held = 0;
    for (int i = 0; i < ncases; i++)
        for (uint32_t p = 0; p < NPOLICIES; p++)
            held += golden_gated(dir, argv[2 + i], &cases[i], p);
    CHECK(held > 0, "the gate held no layer back in any golden case");
    if (timing) {
        printf("time of eplb_aicpu_rebalance, call 1, best of 5:\n");
        for (int i = 0; i < ncases; i++) {
            printf("  %-22s", argv[2 + i]);
            for (uint32_t p = 0; p < NPOLICIES; p++)
                printf(" %s %.3f ms%s", POLICY_NAMES[p], time_policy(&cases[i], p, 0),
                       p + 1 < NPOLICIES ? "," : "\n");
            printf("  %-22s", "  with the pay-off gate");
            for (uint32_t p = 0; p < NPOLICIES; p++)
                printf(" %s %.3f ms%s", POLICY_NAMES[p], time_policy(&cases[i], p, 1),
                       p + 1 < NPOLICIES ? "," : "\n");
        }
    }
    memory_table();
    bad_arguments(&cases[0]);
    live_set();
    printf("%u checks, %u failures\n", checks, failures);
    return failures ? 1 : 0;
}
