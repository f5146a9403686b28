/*
 * eplb_aicpu.h - the C ABI of libeplb_aicpu.a, eplb's AICPU entry point.
 *
 * One call, eplb_aicpu_rebalance(args), runs one rebalance of an Expert Parallelism placement
 * with the caller's memory only: no allocation, no globals, no panics, no I/O. It fits the
 * Ascend AICPU kernel signature `uint32_t Fn(void *args)`.
 *
 * Hand-written; the Rust definitions are in src/lib.rs. Both sides assert the same sizes and
 * offsets (C: _Static_assert / static_assert below; Rust: const asserts), and `cargo xtask aicpu` checks that
 * the two lists, the status codes and the other constants agree. LP64 only (aarch64, x86_64).
 *
 * SPDX-License-Identifier: MIT OR Apache-2.0
 */
#ifndef EPLB_AICPU_H
#define EPLB_AICPU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version of eplb_aicpu_args; args.version must equal it. */
#define EPLB_AICPU_ABI_VERSION 1u

/* Status codes returned by eplb_aicpu_rebalance. */
#define EPLB_AICPU_OK 0u                 /* outputs and args.result written */
#define EPLB_AICPU_E_NULL_ARGS 1u        /* args is NULL; nothing written */
#define EPLB_AICPU_E_VERSION 2u          /* version or struct_size mismatch; nothing written */
#define EPLB_AICPU_E_NULL_POINTER 3u     /* a needed buffer is NULL (or wraps the address space) */
#define EPLB_AICPU_E_MISALIGNED 4u       /* args (8 bytes) or a buffer misaligned for its type */
#define EPLB_AICPU_E_TOO_SHORT 5u        /* a buffer is shorter than the shape needs; detail = elements needed */
#define EPLB_AICPU_E_OVERLAP 6u          /* a written buffer overlaps another buffer or args; field, detail = the two */
#define EPLB_AICPU_E_SHAPE 7u            /* invalid shape */
#define EPLB_AICPU_E_POLICY 8u           /* unknown policy number; detail = the number */
#define EPLB_AICPU_E_LOAD 9u             /* NaN, infinite or negative load; detail = layer * N + expert */
#define EPLB_AICPU_E_SCRATCH 10u         /* scratch too small; detail = words needed */
#define EPLB_AICPU_E_STATE 11u           /* policy state too small; detail = words needed */
#define EPLB_AICPU_E_PLACEMENT 12u       /* current placement not structurally valid; detail = layer */
#define EPLB_AICPU_E_TOPOLOGY 13u        /* topology does not suit the policy; detail = offending value */
#define EPLB_AICPU_E_SAMPLES_REQUIRED 14u /* the policy needs per-window samples */
#define EPLB_AICPU_E_POLICY_FAILED 15u   /* the policy found no valid placement (a bug); detail = layer */

/* Policy numbers (args.policy): vLLM-Ascend's eplb_policy_type 0..4, and 5 for DeepSeek's. */
#define EPLB_AICPU_POLICY_RANDOM 0u
#define EPLB_AICPU_POLICY_DEFAULT 1u
#define EPLB_AICPU_POLICY_SWIFT 2u
#define EPLB_AICPU_POLICY_FLASHLB 3u
#define EPLB_AICPU_POLICY_INCREMENTAL 4u
#define EPLB_AICPU_POLICY_DEEPSEEK 5u

/* Field ids (args.result.field): which argument an error refers to. */
#define EPLB_AICPU_FIELD_NONE 0u
#define EPLB_AICPU_FIELD_SHAPE 1u
#define EPLB_AICPU_FIELD_POLICY 2u
#define EPLB_AICPU_FIELD_CURRENT 3u
#define EPLB_AICPU_FIELD_LOADS 4u
#define EPLB_AICPU_FIELD_SAMPLES 5u
#define EPLB_AICPU_FIELD_OUT_PLACEMENT 6u
#define EPLB_AICPU_FIELD_OUT_CHANGED 7u
#define EPLB_AICPU_FIELD_OUT_PAR_BEFORE 8u
#define EPLB_AICPU_FIELD_OUT_PAR_AFTER 9u
#define EPLB_AICPU_FIELD_SCRATCH 10u
#define EPLB_AICPU_FIELD_STATE 11u
#define EPLB_AICPU_FIELD_ARGS 12u

/* What one call reports besides its buffers. Written by every call that gets past the version
 * check: on success the summary, on failure zeros and field / detail. */
typedef struct eplb_aicpu_result {
    uint32_t changed_layers;  /* layers whose placement changed */
    uint32_t colocated_rows;  /* (layer, rank) rows holding an expert twice (DeepSeek only) */
    uint64_t moves;           /* (rank, expert) copies to fetch */
    double par_mean_before;   /* mean PAR over layers, current placement */
    double par_max_before;    /* max PAR over layers, current placement */
    double par_mean_after;    /* mean PAR over layers, new placement */
    double par_max_after;     /* max PAR over layers, new placement */
    uint32_t field;           /* on failure: EPLB_AICPU_FIELD_* */
    uint32_t reserved;        /* written as 0 */
    uint64_t detail;          /* on failure: see the status code */
} eplb_aicpu_result;

/*
 * The argument block, version 1. Lengths count elements (not bytes) and may exceed what the
 * shape needs. ranks_per_node = 0 means one node (R); groups = 0 means one group; windows = 0
 * means no per-window samples. state may be NULL when eplb_aicpu_state_len() is 0. The first 8
 * bytes (version, struct_size) are the same in every version.
 *   placement length P = L * R * S (u16 expert ids, [L][R][S])
 *   loads length       L * N       (f64, finite, >= 0, [L][N])
 *   samples length     T * L * N   (f64, [T][L][N], oldest window first)
 */
typedef struct eplb_aicpu_args {
    uint32_t version;           /* EPLB_AICPU_ABI_VERSION */
    uint32_t struct_size;       /* sizeof(eplb_aicpu_args) */
    uint16_t layers;            /* L */
    uint16_t experts;           /* N */
    uint16_t ranks;             /* R */
    uint16_t slots_per_rank;    /* S */
    uint16_t ranks_per_node;    /* 0: R */
    uint16_t groups;            /* 0: 1 */
    uint32_t policy;            /* EPLB_AICPU_POLICY_* */
    uint64_t seed;
    uint64_t windows;           /* T, 0: no samples */
    const uint16_t *current;    /* read, >= P */
    uint64_t current_len;
    const double *loads;        /* read, >= L*N */
    uint64_t loads_len;
    const double *samples;      /* read when windows >= 1, >= T*L*N */
    uint64_t samples_len;
    uint16_t *out_placement;    /* written, >= P */
    uint64_t out_placement_len;
    uint8_t *out_changed;       /* written 0/1 per layer, >= L */
    uint64_t out_changed_len;
    double *out_par_before;     /* written per layer, >= L */
    uint64_t out_par_before_len;
    double *out_par_after;      /* written per layer, >= L */
    uint64_t out_par_after_len;
    uint64_t *scratch;          /* per call, >= eplb_aicpu_scratch_len() words */
    uint64_t scratch_len;
    uint64_t *state;            /* kept across calls, zeros = fresh, >= eplb_aicpu_state_len() */
    uint64_t state_len;
    eplb_aicpu_result result;   /* written by the call */
} eplb_aicpu_args;

/* Layout, asserted with the same numbers in src/lib.rs. Valid C11 and C++11. */
#ifdef __cplusplus
#define EPLB_AICPU_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#define EPLB_AICPU_ALIGNOF(type) alignof(type)
#else
#define EPLB_AICPU_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#define EPLB_AICPU_ALIGNOF(type) _Alignof(type)
#endif
EPLB_AICPU_STATIC_ASSERT(sizeof(void *) == 8, "eplb_aicpu ABI is LP64 only");
EPLB_AICPU_STATIC_ASSERT(sizeof(eplb_aicpu_result) == 64, "eplb_aicpu_result size");
EPLB_AICPU_STATIC_ASSERT(EPLB_AICPU_ALIGNOF(eplb_aicpu_result) == 8, "eplb_aicpu_result align");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_result, changed_layers) == 0, "changed_layers");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_result, colocated_rows) == 4, "colocated_rows");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_result, moves) == 8, "moves");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_result, par_mean_before) == 16, "par_mean_before");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_result, par_max_before) == 24, "par_max_before");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_result, par_mean_after) == 32, "par_mean_after");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_result, par_max_after) == 40, "par_max_after");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_result, field) == 48, "field");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_result, reserved) == 52, "reserved");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_result, detail) == 56, "detail");

EPLB_AICPU_STATIC_ASSERT(sizeof(eplb_aicpu_args) == 248, "eplb_aicpu_args size");
EPLB_AICPU_STATIC_ASSERT(EPLB_AICPU_ALIGNOF(eplb_aicpu_args) == 8, "eplb_aicpu_args align");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, version) == 0, "version");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, struct_size) == 4, "struct_size");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, layers) == 8, "layers");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, experts) == 10, "experts");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, ranks) == 12, "ranks");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, slots_per_rank) == 14, "slots_per_rank");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, ranks_per_node) == 16, "ranks_per_node");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, groups) == 18, "groups");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, policy) == 20, "policy");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, seed) == 24, "seed");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, windows) == 32, "windows");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, current) == 40, "current");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, current_len) == 48, "current_len");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, loads) == 56, "loads");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, loads_len) == 64, "loads_len");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, samples) == 72, "samples");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, samples_len) == 80, "samples_len");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, out_placement) == 88, "out_placement");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, out_placement_len) == 96, "out_placement_len");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, out_changed) == 104, "out_changed");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, out_changed_len) == 112, "out_changed_len");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, out_par_before) == 120, "out_par_before");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, out_par_before_len) == 128, "out_par_before_len");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, out_par_after) == 136, "out_par_after");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, out_par_after_len) == 144, "out_par_after_len");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, scratch) == 152, "scratch");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, scratch_len) == 160, "scratch_len");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, state) == 168, "state");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, state_len) == 176, "state_len");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, result) == 184, "result");

/*
 * Runs one rebalance and returns EPLB_AICPU_OK or an EPLB_AICPU_E_* status. args points to an
 * eplb_aicpu_args (8-byte aligned) whose buffers are valid for their stated lengths; nothing else
 * touches them during the call. Null, misaligned, short and overlapping buffers are detected.
 * On a non-zero status the output buffers are unspecified: keep the current placement.
 * Reentrant: calls on disjoint buffers may run concurrently.
 */
uint32_t eplb_aicpu_rebalance(void *args);

/*
 * Scratch words (uint64_t) eplb_aicpu_rebalance needs for this shape and policy; 0 when the
 * shape or policy number is invalid (a valid input always needs at least one word).
 */
uint64_t eplb_aicpu_scratch_len(uint16_t layers, uint16_t experts, uint16_t ranks,
                                uint16_t slots_per_rank, uint16_t ranks_per_node,
                                uint16_t groups, uint32_t policy);

/*
 * Policy state words (uint64_t) for this shape and policy: 0 when the policy keeps no state,
 * and also 0 on invalid input (check with eplb_aicpu_scratch_len, which is 0 only then).
 */
uint64_t eplb_aicpu_state_len(uint16_t layers, uint16_t experts, uint16_t ranks,
                              uint16_t slots_per_rank, uint16_t ranks_per_node,
                              uint16_t groups, uint32_t policy);

/* The ABI version the library implements; compare with EPLB_AICPU_ABI_VERSION. */
uint32_t eplb_aicpu_abi_version(void);

#ifdef __cplusplus
}
#endif

#endif /* EPLB_AICPU_H */
