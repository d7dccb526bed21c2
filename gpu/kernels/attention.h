/* Decode attention from the paged KV pool (attention.c), for kernels that attend inside their
 * own parallel region (decode_step.c). */
#ifndef TOKENMILL_ATTENTION_H
#define TOKENMILL_ATTENTION_H

#include <stdint.h>

/* One sequence's query heads of KV heads [h0, h1) over its positions [first, ctx): q, out
 * [(h1 - h0) · group, head_dim] (the sequence's rows from KV head h0's first query head on),
 * `table` its block table, k, v one layer of the pool [blocks, block_size, kv_heads,
 * head_dim]. softcap > 0: Gemma 2's score soft-capping. Called by one thread. */
void tm_attend(const float *qs, float *os, const float *k, const float *v, const int64_t *table,
               int64_t first, int64_t ctx, int64_t h0, int64_t h1, int64_t block_size,
               int64_t kv_heads, int64_t group, int64_t head_dim, float scale, float softcap);

#endif
