/*
 * eplb_aicpu.h - the C ABI of libeplb_aicpu.a, eplb's AICPU entry point.
 *
 * One call, eplb_aicpu_rebalance(args), runs one rebalance of an Expert Parallelism placement
 * with the caller's memory only: no allocation, no globals, no panics, no I/O. It fits the
 * Ascend AICPU kernel signature `uint32_t Fn(void *args)`.
 *
 * Versions. The argument block starts with version and struct_size in every version. This
 * header describes version 3 (432 bytes): version 2 (the first 408 bytes, up to and including
 * `gate_result`) plus the live ranks (live, live_len) and the reloads count; version 2 is
 * version 1 (the first 248 bytes, up to and including `result`) plus the pay-off gate
 * (payoff_gate, gate, gate_result). The library accepts all three: a caller built against an
 * older header passes its version and size (1 and 248, or 2 and 408), and the call behaves
 * exactly as before, reading and writing nothing beyond its block. A version 2 block with
 * payoff_gate = 0 behaves as version 1 and writes gate_result as zeros; a version 3 block with
 * live = NULL behaves as version 2 and writes reloads as 0.
 *
 * Live ranks (version 3, elastic EP). With live set ([R] bytes, 1 = live, 0 = gone) the call
 * plans over the live ranks only (eplb_policies::rebalance_live): current may hold
 * EPLB_AICPU_EMPTY (every slot of a dead rank must; a live rank that joined may be all EMPTY),
 * the policy plans on the live ranks in ascending order (ranks_per_node kept when it divides
 * their count, else one node), and out_placement has EPLB_AICPU_EMPTY on every slot of a dead
 * rank and every expert on a live rank. reloads counts the (rank, expert) copies of experts
 * that had no copy on a live rank (load them from storage); moves counts against the real
 * current; out_par_before / out_par_after are over the live ranks. Size the buffers with
 * eplb_aicpu_scratch_len_v3(..., 0, 1) / eplb_aicpu_state_len_v3(..., 0, 1): enough for any
 * live set of the shape. Not combined with the pay-off gate (EPLB_AICPU_E_LIVE).
 *
 * The pay-off gate (docs/time-model.md, "The pay-off gate"). With payoff_gate = 1, after the
 * policy a changed layer keeps its new placement only when the time model predicts that its
 * saving over the next cycle (gate.heat_interval + gate.algo_interval iterations, times the
 * cycles the layer's placement has lived) exceeds the stall its exchange adds; the other
 * layers get their current rows back, out_changed 0 and out_par_after = out_par_before, and
 * result is recomputed for the gated placement. This is what eplb's runtime (PolicyHost) does
 * with the same gate, byte for byte. Every input is agreed among ranks (the plan, the loads,
 * the gate block, the ages), so every rank takes the same decision.
 *   - gate: the time model's numbers, per rank (one die), one direction; the presets and
 *     their sources are in docs/time-model.md (e.g. A3: flops_bf16 376e12, flops_8bit 752e12,
 *     flops_fp4 0, hbm 1.6e12, intra 196e9, inter 25e9 B/s, layer overhead 0.1 ms, collective
 *     0.1 ms; DeepSeek-V3: hidden 7168, intermediate 2048, top_k 8, 1 shared expert, W8A8 =
 *     EPLB_AICPU_DTYPE_INT8, 44085248 expert bytes; decode 128 tokens per rank, prefill
 *     16384; the runtime's default intervals 600 + 50). The node split is the shape's
 *     ranks_per_node.
 *   - state: with the gate on the state holds the policy's words, then one word per layer:
 *     the cycles the layer's placement has lived (0 reads as 1; the call writes 1 for a layer
 *     that moves, one more for the others). Size it with eplb_aicpu_state_len_v2(..., 1).
 *     Keep the state only for cycles every rank took (as for the policy's words); zero it on a
 *     resync. Changing payoff_gate changes the state's size: start from zeros.
 *   - scratch: eplb_aicpu_scratch_len_v2(..., 1) words.
 *   - gate_result: changed / moved / held layers and the predicted saving, stall and forgone
 *     saving (zeros when the gate is off or the call failed).
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

/* Version of eplb_aicpu_args this header describes (the library also accepts versions 1, 2). */
#define EPLB_AICPU_ABI_VERSION 3u
/* struct_size of a version 1 block: the fields up to and including `result`. */
#define EPLB_AICPU_ARGS_V1_SIZE 248u
/* struct_size of a version 2 block: the fields up to and including `gate_result`. */
#define EPLB_AICPU_ARGS_V2_SIZE 408u
/* A slot that holds no expert (a dead rank's, or a joined rank's without weights yet). */
#define EPLB_AICPU_EMPTY 65535u

/* Status codes returned by eplb_aicpu_rebalance. */
#define EPLB_AICPU_OK 0u                 /* outputs and args.result written */
#define EPLB_AICPU_E_NULL_ARGS 1u        /* args is NULL; nothing written */
#define EPLB_AICPU_E_VERSION 2u          /* not (3, 432), (2, 408) nor (1, 248); nothing written */
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
#define EPLB_AICPU_E_GATE 16u            /* a pay-off gate input is invalid: payoff_gate not 0/1, or a
                                          * gate field NaN, infinite, negative, a zero rate or size, an
                                          * unknown dtype/routing, top_k > experts, both intervals 0;
                                          * field = EPLB_AICPU_FIELD_(PAYOFF_)GATE_*, detail = the
                                          * value (a double's IEEE-754 bits) */
#define EPLB_AICPU_E_LIVE 17u            /* live ranks invalid (version 3): a byte not 0/1 (detail =
                                          * rank), live * S < N (detail = live ranks), or live set
                                          * with payoff_gate = 1 (field = PAYOFF_GATE) */

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
#define EPLB_AICPU_FIELD_PAYOFF_GATE 13u
#define EPLB_AICPU_FIELD_GATE_FLOPS_BF16 14u
#define EPLB_AICPU_FIELD_GATE_FLOPS_8BIT 15u
#define EPLB_AICPU_FIELD_GATE_FLOPS_FP4 16u
#define EPLB_AICPU_FIELD_GATE_HBM 17u
#define EPLB_AICPU_FIELD_GATE_INTRA_NODE 18u
#define EPLB_AICPU_FIELD_GATE_INTER_NODE 19u
#define EPLB_AICPU_FIELD_GATE_LAYER_OVERHEAD 20u
#define EPLB_AICPU_FIELD_GATE_COLLECTIVE 21u
#define EPLB_AICPU_FIELD_GATE_HIDDEN 22u
#define EPLB_AICPU_FIELD_GATE_INTERMEDIATE 23u
#define EPLB_AICPU_FIELD_GATE_TOP_K 24u
#define EPLB_AICPU_FIELD_GATE_DTYPE 25u
#define EPLB_AICPU_FIELD_GATE_ROUTING 26u
#define EPLB_AICPU_FIELD_GATE_TOKENS_PER_RANK 27u
#define EPLB_AICPU_FIELD_GATE_EXPERT_BYTES 28u
#define EPLB_AICPU_FIELD_GATE_INTERVALS 29u /* heat_interval + algo_interval = 0 */
#define EPLB_AICPU_FIELD_LIVE 30u

/* Compute dtypes (gate.dtype): the activation side of the quant type. */
#define EPLB_AICPU_DTYPE_BF16 0u /* bf16 / fp16 */
#define EPLB_AICPU_DTYPE_INT8 1u /* W8A8, W8A8-Dynamic, W4A8 */
#define EPLB_AICPU_DTYPE_FP8 2u
#define EPLB_AICPU_DTYPE_FP4 3u  /* at the 8-bit peak when flops_fp4 = 0 */

/* Routing models (gate.routing): how an expert's tokens split over its copies. */
#define EPLB_AICPU_ROUTING_LOG2PHY 0u /* vLLM-Ascend's static log2phy (the runtime's gate) */
#define EPLB_AICPU_ROUTING_EVEN 1u    /* an even split */

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

/* The pay-off gate's inputs (version 2): the time model (docs/time-model.md) and the cycle. */
typedef struct eplb_aicpu_gate {
    double flops_bf16;             /* dense bf16 peak, FLOP/s, > 0 */
    double flops_8bit;             /* dense int8/fp8 peak, FLOP/s, > 0 */
    double flops_fp4;              /* dense fp4 peak, FLOP/s, >= 0 (0: the 8-bit peak) */
    double hbm_bytes_per_s;        /* HBM bandwidth, B/s, > 0 */
    double intra_node_bytes_per_s; /* one rank, one direction, B/s, > 0 */
    double inter_node_bytes_per_s; /* one rank, one direction, B/s, > 0 */
    double layer_overhead_ms;      /* fixed time of one MoE layer on one rank, >= 0 */
    double collective_ms;          /* one small collective over the EP group, >= 0 */
    uint32_t hidden;               /* H, >= 1 */
    uint32_t intermediate;         /* expert intermediate size I, >= 1 */
    uint16_t experts;              /* routed experts, 0: N */
    uint16_t top_k;                /* 1..experts */
    uint16_t moe_layers;           /* 0: L */
    uint16_t shared_experts;       /* shared experts per MoE layer */
    uint32_t dtype;                /* EPLB_AICPU_DTYPE_* */
    uint32_t routing;              /* EPLB_AICPU_ROUTING_* */
    double tokens_per_rank;        /* T, tokens per iteration per rank, > 0 */
    double expert_bytes;           /* one expert's weights and scales, >= 0 */
    uint32_t heat_interval;        /* H, iterations */
    uint32_t algo_interval;        /* A, iterations; H + A >= 1 */
} eplb_aicpu_gate;

/* What the pay-off gate did (version 2); zeros when the gate is off or the call failed. */
typedef struct eplb_aicpu_gate_result {
    uint32_t changed_layers;    /* layers the policy changed */
    uint32_t moved_layers;      /* of them, layers whose move pays (new placement) */
    uint32_t held_layers;       /* of them, layers held back (current rows kept) */
    uint32_t reserved;          /* written as 0 */
    double saving_ms_per_iter;  /* predicted MoE time per iteration saved by the moved layers */
    double stall_ms;            /* predicted stall of their exchanges */
    double forgone_ms_per_iter; /* predicted saving per iteration given up by the held layers */
} eplb_aicpu_gate_result;

/*
 * The argument block, version 3 (version 1: up to and including `result`; version 2: up to and
 * including `gate_result`). Lengths count elements (not bytes) and may exceed what the
 * shape needs. ranks_per_node = 0 means one node (R); groups = 0 means one group; windows = 0
 * means no per-window samples. state may be NULL when eplb_aicpu_state_len() is 0. The first 8
 * bytes (version, struct_size) are the same in every version.
 *   placement length P = L * R * S (u16 expert ids, [L][R][S])
 *   loads length       L * N       (f64, finite, >= 0, [L][N])
 *   samples length     T * L * N   (f64, [T][L][N], oldest window first)
 *   live length        R           (u8 0/1, [R]; version 3, when live is set)
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
    uint64_t *scratch;          /* per call, >= eplb_aicpu_scratch_len_v3() words */
    uint64_t scratch_len;
    uint64_t *state;            /* kept across calls, zeros = fresh, >= eplb_aicpu_state_len_v3() */
    uint64_t state_len;
    eplb_aicpu_result result;   /* written by the call */
    /* version 2 */
    uint32_t payoff_gate;       /* 1: the pay-off gate on, 0: off */
    uint32_t reserved;          /* set to 0 (not read) */
    eplb_aicpu_gate gate;       /* read when payoff_gate = 1 */
    eplb_aicpu_gate_result gate_result; /* written by the call */
    /* version 3 */
    const uint8_t *live;        /* read, >= R: 1 live, 0 gone; NULL: all live (version 2's call) */
    uint64_t live_len;
    uint64_t reloads;           /* written: copies of experts without a live copy (storage loads) */
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

EPLB_AICPU_STATIC_ASSERT(sizeof(eplb_aicpu_gate) == 112, "eplb_aicpu_gate size");
EPLB_AICPU_STATIC_ASSERT(EPLB_AICPU_ALIGNOF(eplb_aicpu_gate) == 8, "eplb_aicpu_gate align");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, flops_bf16) == 0, "flops_bf16");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, flops_8bit) == 8, "flops_8bit");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, flops_fp4) == 16, "flops_fp4");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, hbm_bytes_per_s) == 24, "hbm_bytes_per_s");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, intra_node_bytes_per_s) == 32, "intra_node_bytes_per_s");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, inter_node_bytes_per_s) == 40, "inter_node_bytes_per_s");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, layer_overhead_ms) == 48, "layer_overhead_ms");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, collective_ms) == 56, "collective_ms");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, hidden) == 64, "hidden");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, intermediate) == 68, "intermediate");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, experts) == 72, "experts");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, top_k) == 74, "top_k");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, moe_layers) == 76, "moe_layers");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, shared_experts) == 78, "shared_experts");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, dtype) == 80, "dtype");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, routing) == 84, "routing");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, tokens_per_rank) == 88, "tokens_per_rank");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, expert_bytes) == 96, "expert_bytes");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, heat_interval) == 104, "heat_interval");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate, algo_interval) == 108, "algo_interval");

EPLB_AICPU_STATIC_ASSERT(sizeof(eplb_aicpu_gate_result) == 40, "eplb_aicpu_gate_result size");
EPLB_AICPU_STATIC_ASSERT(EPLB_AICPU_ALIGNOF(eplb_aicpu_gate_result) == 8, "eplb_aicpu_gate_result align");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate_result, changed_layers) == 0, "gate changed_layers");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate_result, moved_layers) == 4, "moved_layers");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate_result, held_layers) == 8, "held_layers");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate_result, reserved) == 12, "gate reserved");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate_result, saving_ms_per_iter) == 16, "saving_ms_per_iter");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate_result, stall_ms) == 24, "stall_ms");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_gate_result, forgone_ms_per_iter) == 32, "forgone_ms_per_iter");

EPLB_AICPU_STATIC_ASSERT(sizeof(eplb_aicpu_args) == 432, "eplb_aicpu_args size");
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
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, payoff_gate) == 248, "payoff_gate");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, reserved) == 252, "reserved");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, gate) == 256, "gate");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, gate_result) == 368, "gate_result");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, live) == 408, "live");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, live_len) == 416, "live_len");
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_args, reloads) == 424, "reloads");

/*
 * Runs one rebalance and returns EPLB_AICPU_OK or an EPLB_AICPU_E_* status. args points to an
 * eplb_aicpu_args (8-byte aligned) whose buffers are valid for their stated lengths; nothing else
 * touches them during the call. Null, misaligned, short and overlapping buffers are detected.
 * On a non-zero status the output buffers are unspecified: keep the current placement.
 * Reentrant: calls on disjoint buffers may run concurrently.
 */
uint32_t eplb_aicpu_rebalance(void *args);

/*
 * Scratch words (uint64_t) eplb_aicpu_rebalance needs for this shape and policy with the
 * pay-off gate off; 0 when the shape or policy number is invalid (a valid input always needs
 * at least one word). Equal to eplb_aicpu_scratch_len_v2(..., 0).
 */
uint64_t eplb_aicpu_scratch_len(uint16_t layers, uint16_t experts, uint16_t ranks,
                                uint16_t slots_per_rank, uint16_t ranks_per_node,
                                uint16_t groups, uint32_t policy);

/*
 * Policy state words (uint64_t) for this shape and policy with the pay-off gate off: 0 when
 * the policy keeps no state, and also 0 on invalid input (check with eplb_aicpu_scratch_len,
 * which is 0 only then). Equal to eplb_aicpu_state_len_v2(..., 0).
 */
uint64_t eplb_aicpu_state_len(uint16_t layers, uint16_t experts, uint16_t ranks,
                              uint16_t slots_per_rank, uint16_t ranks_per_node,
                              uint16_t groups, uint32_t policy);

/*
 * Version 2 sizing: as above, with payoff_gate as in eplb_aicpu_args. With payoff_gate = 1
 * the scratch grows by the gate's buffers and the state by one word per layer (the ages); 0
 * when the shape, the policy number or payoff_gate (not 0 or 1) is invalid.
 */
uint64_t eplb_aicpu_scratch_len_v2(uint16_t layers, uint16_t experts, uint16_t ranks,
                                   uint16_t slots_per_rank, uint16_t ranks_per_node,
                                   uint16_t groups, uint32_t policy, uint32_t payoff_gate);
uint64_t eplb_aicpu_state_len_v2(uint16_t layers, uint16_t experts, uint16_t ranks,
                                 uint16_t slots_per_rank, uint16_t ranks_per_node,
                                 uint16_t groups, uint32_t policy, uint32_t payoff_gate);

/*
 * Version 3 sizing: as version 2, with live = 1 for a call with args.live set (enough for any
 * live set of the shape: size once) and 0 without (then equal to the version 2 functions); 0
 * when the shape, the policy number or a flag is invalid, or payoff_gate = 1 with live = 1.
 */
uint64_t eplb_aicpu_scratch_len_v3(uint16_t layers, uint16_t experts, uint16_t ranks,
                                   uint16_t slots_per_rank, uint16_t ranks_per_node,
                                   uint16_t groups, uint32_t policy, uint32_t payoff_gate,
                                   uint32_t live);
uint64_t eplb_aicpu_state_len_v3(uint16_t layers, uint16_t experts, uint16_t ranks,
                                 uint16_t slots_per_rank, uint16_t ranks_per_node,
                                 uint16_t groups, uint32_t policy, uint32_t payoff_gate,
                                 uint32_t live);

/* The newest ABI version the library implements (it accepts every version from 1 up to it);
 * a caller checks that it is at least the EPLB_AICPU_ABI_VERSION it was built with. */
uint32_t eplb_aicpu_abi_version(void);

#ifdef __cplusplus
}
#endif

#endif /* EPLB_AICPU_H */
