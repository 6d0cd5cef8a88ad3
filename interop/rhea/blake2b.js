'use strict';
// BLAKE2b (RFC 7693), unkeyed, on pairs of 32-bit words (node's crypto has only BLAKE2b-512, and the
// ledger's body digest is BLAKE2b-128). Checked against Python's hashlib.blake2b by the interop tests.

const IV32 = new Uint32Array([
  0xF3BCC908, 0x6A09E667, 0x84CAA73B, 0xBB67AE85, 0xFE94F82B, 0x3C6EF372, 0x5F1D36F1, 0xA54FF53A,
  0xADE682D1, 0x510E527F, 0x2B3E6C1F, 0x9B05688C, 0xFB41BD6B, 0x1F83D9AB, 0x137E2179, 0x5BE0CD19]);
const SIGMA = [
  0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3,
  11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4, 7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8,
  9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13, 2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9,
  12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11, 13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10,
  6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5, 10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0,
  0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3,
].map((x) => x * 2); // word index -> index of its low half

const v = new Uint32Array(32);
const m = new Uint32Array(32);

function add64(a, b) { // v[a] += v[b] (64-bit, low word first)
  const lo = v[a] + v[b];
  v[a + 1] = v[a + 1] + v[b + 1] + (lo >= 0x100000000 ? 1 : 0);
  v[a] = lo;
}

function add64m(a, i) { // v[a] += m[i]
  const lo = v[a] + m[i];
  v[a + 1] = v[a + 1] + m[i + 1] + (lo >= 0x100000000 ? 1 : 0);
  v[a] = lo;
}

function G(a, b, c, d, ix, iy) {
  let x0, x1;
  add64(a, b); add64m(a, ix);
  x0 = v[d] ^ v[a]; x1 = v[d + 1] ^ v[a + 1]; v[d] = x1; v[d + 1] = x0;                       // rotr 32
  add64(c, d);
  x0 = v[b] ^ v[c]; x1 = v[b + 1] ^ v[c + 1];
  v[b] = (x0 >>> 24) ^ (x1 << 8); v[b + 1] = (x1 >>> 24) ^ (x0 << 8);                          // rotr 24
  add64(a, b); add64m(a, iy);
  x0 = v[d] ^ v[a]; x1 = v[d + 1] ^ v[a + 1];
  v[d] = (x0 >>> 16) ^ (x1 << 16); v[d + 1] = (x1 >>> 16) ^ (x0 << 16);                        // rotr 16
  add64(c, d);
  x0 = v[b] ^ v[c]; x1 = v[b + 1] ^ v[c + 1];
  v[b] = (x1 >>> 31) ^ (x0 << 1); v[b + 1] = (x0 >>> 31) ^ (x1 << 1);                          // rotr 63
}

function compress(ctx, last) {
  for (let i = 0; i < 16; i++) { v[i] = ctx.h[i]; v[i + 16] = IV32[i]; }
  v[24] ^= ctx.t % 0x100000000;
  v[25] ^= Math.floor(ctx.t / 0x100000000);
  if (last) { v[28] = ~v[28]; v[29] = ~v[29]; }
  for (let i = 0; i < 32; i++) {
    m[i] = ctx.b[4 * i] | (ctx.b[4 * i + 1] << 8) | (ctx.b[4 * i + 2] << 16) | (ctx.b[4 * i + 3] << 24);
  }
  for (let r = 0; r < 12; r++) {
    const s = r * 16;
    G(0, 8, 16, 24, SIGMA[s], SIGMA[s + 1]);
    G(2, 10, 18, 26, SIGMA[s + 2], SIGMA[s + 3]);
    G(4, 12, 20, 28, SIGMA[s + 4], SIGMA[s + 5]);
    G(6, 14, 22, 30, SIGMA[s + 6], SIGMA[s + 7]);
    G(0, 10, 20, 30, SIGMA[s + 8], SIGMA[s + 9]);
    G(2, 12, 22, 24, SIGMA[s + 10], SIGMA[s + 11]);
    G(4, 14, 16, 26, SIGMA[s + 12], SIGMA[s + 13]);
    G(6, 8, 18, 28, SIGMA[s + 14], SIGMA[s + 15]);
  }
  for (let i = 0; i < 16; i++) ctx.h[i] = ctx.h[i] ^ v[i] ^ v[i + 16];
}

function blake2b(input, outlen) {
  const ctx = { b: new Uint8Array(128), h: new Uint32Array(IV32), t: 0, c: 0 };
  ctx.h[0] ^= 0x01010000 ^ outlen;
  for (let i = 0; i < input.length; i++) {
    if (ctx.c === 128) { ctx.t += ctx.c; compress(ctx, false); ctx.c = 0; }
    ctx.b[ctx.c++] = input[i];
  }
  ctx.t += ctx.c;
  while (ctx.c < 128) ctx.b[ctx.c++] = 0;
  compress(ctx, true);
  const out = Buffer.alloc(outlen);
  for (let i = 0; i < outlen; i++) out[i] = ctx.h[i >> 2] >>> (8 * (i & 3));
  return out;
}

module.exports = { blake2b };
