/*
 * BLAKE2b (RFC 7693), unkeyed, for the ledger's body digest (BLAKE2b-128). Written from the RFC's
 * description and reference code; checked against Python's hashlib.blake2b by the interop tests.
 */
#ifndef EOROUTER_INTEROP_BLAKE2B_H
#define EOROUTER_INTEROP_BLAKE2B_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint8_t b[128];
  uint64_t h[8];
  uint64_t t[2];
  size_t c;
  size_t outlen;
} b2b_ctx;

#define B2B_ROTR64(x, y) (((x) >> (y)) ^ ((x) << (64 - (y))))
#define B2B_G(a, b, c, d, x, y) {                        \
    v[a] = v[a] + v[b] + x; v[d] = B2B_ROTR64(v[d] ^ v[a], 32); \
    v[c] = v[c] + v[d];     v[b] = B2B_ROTR64(v[b] ^ v[c], 24); \
    v[a] = v[a] + v[b] + y; v[d] = B2B_ROTR64(v[d] ^ v[a], 16); \
    v[c] = v[c] + v[d];     v[b] = B2B_ROTR64(v[b] ^ v[c], 63); }

static const uint64_t b2b_iv[8] = {
  0x6A09E667F3BCC908ULL, 0xBB67AE8584CAA73BULL, 0x3C6EF372FE94F82BULL, 0xA54FF53A5F1D36F1ULL,
  0x510E527FADE682D1ULL, 0x9B05688C2B3E6C1FULL, 0x1F83D9ABFB41BD6BULL, 0x5BE0CD19137E2179ULL};

static inline void b2b_compress(b2b_ctx *ctx, int last) {
  static const uint8_t sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};
  uint64_t v[16], m[16];
  int i, j;
  for (i = 0; i < 8; i++) { v[i] = ctx->h[i]; v[i + 8] = b2b_iv[i]; }
  v[12] ^= ctx->t[0];
  v[13] ^= ctx->t[1];
  if (last) v[14] = ~v[14];
  for (i = 0; i < 16; i++) {
    m[i] = 0;
    for (j = 7; j >= 0; j--) m[i] = (m[i] << 8) | ctx->b[8 * i + j]; /* little-endian */
  }
  for (i = 0; i < 12; i++) {
    B2B_G(0, 4, 8, 12, m[sigma[i][0]], m[sigma[i][1]]);
    B2B_G(1, 5, 9, 13, m[sigma[i][2]], m[sigma[i][3]]);
    B2B_G(2, 6, 10, 14, m[sigma[i][4]], m[sigma[i][5]]);
    B2B_G(3, 7, 11, 15, m[sigma[i][6]], m[sigma[i][7]]);
    B2B_G(0, 5, 10, 15, m[sigma[i][8]], m[sigma[i][9]]);
    B2B_G(1, 6, 11, 12, m[sigma[i][10]], m[sigma[i][11]]);
    B2B_G(2, 7, 8, 13, m[sigma[i][12]], m[sigma[i][13]]);
    B2B_G(3, 4, 9, 14, m[sigma[i][14]], m[sigma[i][15]]);
  }
  for (i = 0; i < 8; ++i) ctx->h[i] ^= v[i] ^ v[i + 8];
}

static inline void b2b_init(b2b_ctx *ctx, size_t outlen) {
  int i;
  for (i = 0; i < 8; i++) ctx->h[i] = b2b_iv[i];
  ctx->h[0] ^= 0x01010000ULL ^ (uint64_t)outlen; /* no key */
  ctx->t[0] = ctx->t[1] = 0;
  ctx->c = 0;
  ctx->outlen = outlen;
}

static inline void b2b_update(b2b_ctx *ctx, const void *in, size_t inlen) {
  size_t i;
  for (i = 0; i < inlen; i++) {
    if (ctx->c == 128) {
      ctx->t[0] += ctx->c;
      if (ctx->t[0] < ctx->c) ctx->t[1]++;
      b2b_compress(ctx, 0);
      ctx->c = 0;
    }
    ctx->b[ctx->c++] = ((const uint8_t *)in)[i];
  }
}

static inline void b2b_final(b2b_ctx *ctx, uint8_t *out) {
  size_t i;
  ctx->t[0] += ctx->c;
  if (ctx->t[0] < ctx->c) ctx->t[1]++;
  while (ctx->c < 128) ctx->b[ctx->c++] = 0;
  b2b_compress(ctx, 1);
  for (i = 0; i < ctx->outlen; i++) out[i] = (uint8_t)((ctx->h[i >> 3] >> (8 * (i & 7))) & 0xFF);
}

#endif
