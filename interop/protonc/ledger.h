/*
 * eorouter interop peers on Qpid Proton C: the ledger (JSON lines) and the message shape.
 * The contract (command line, message, ledger fields) is described in interop/clientkit.py.
 */
#ifndef EOROUTER_INTEROP_LEDGER_H
#define EOROUTER_INTEROP_LEDGER_H

#include <proton/codec.h>
#include <proton/message.h>

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "blake2b.h"

typedef struct ledger_t {
  FILE *f;
  const char *client, *link, *role, *topic;
  char router[300];
  char incarnation[128]; /* the router's eorouter:incarnation for our link ("" before the attach) */
} ledger_t;

/* One ledger line's own fields (designated initializers; unset pointers are null). */
typedef struct ledger_fields_t {
  const char *event;
  int64_t seq;                          /* < 0: null */
  const char *delivery; size_t delivery_n;
  const char *pub_tag; size_t pub_tag_n;
  const char *outcome;
  const char *digest;                   /* hex */
  long size;                            /* <= 0: omitted */
  const char *condition;                /* outcome lines: always written (null when NULL) */
  int presettled, held;
} ledger_fields_t;

static inline double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline double mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline void json_str(FILE *f, const char *s) {
  if (!s) { fputs("null", f); return; }
  fputc('"', f);
  for (; *s; ++s) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') { fputc('\\', f); fputc(c, f); }
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

static inline void json_hex(FILE *f, const char *bytes, size_t n) {
  size_t i;
  if (!bytes) { fputs("null", f); return; }
  fputc('"', f);
  for (i = 0; i < n; ++i) fprintf(f, "%02x", (unsigned char)bytes[i]);
  fputc('"', f);
}

/* One ledger line, fields in docs/ledger.md's order, then the extras. */
static inline void ledger_write(ledger_t *l, ledger_fields_t x) {
  FILE *f = l->f;
  const char *pub_tag = x.pub_tag;
  size_t pub_tag_n = x.pub_tag_n;
  /* a subscriber recovers the publisher's tag from the router's tag when it is inline (docs/tags.md) */
  if (!pub_tag && x.delivery && x.delivery_n >= 17 && (unsigned char)x.delivery[16] <= 15 &&
      x.delivery_n == 17 + (size_t)(unsigned char)x.delivery[16]) {
    pub_tag = x.delivery + 17;
    pub_tag_n = x.delivery_n - 17;
  }
  fprintf(f, "{\"ts\": %.6f, \"client\": ", wall_now());
  json_str(f, l->client);
  fputs(", \"link\": ", f); json_str(f, l->link);
  fputs(", \"role\": ", f); json_str(f, l->role);
  fputs(", \"event\": ", f); json_str(f, x.event);
  fputs(", \"topic\": ", f); json_str(f, l->topic);
  fputs(", \"delivery\": ", f); json_hex(f, x.delivery, x.delivery_n);
  fputs(", \"pub_tag\": ", f); json_hex(f, pub_tag, pub_tag_n);
  if (x.seq >= 0) fprintf(f, ", \"seq\": %" PRId64, x.seq); else fputs(", \"seq\": null", f);
  fputs(", \"outcome\": ", f); json_str(f, x.outcome);
  fputs(", \"router\": ", f); json_str(f, l->router);
  fputs(", \"incarnation\": ", f);
  json_str(f, strcmp(l->role, "publisher") == 0 && l->incarnation[0] ? l->incarnation : NULL);
  fputs(", \"digest\": ", f); json_str(f, x.digest);
  fputs(", \"message_id\": null", f);
  if (x.size > 0) fprintf(f, ", \"size\": %ld", x.size);
  if (strcmp(x.event, "outcome") == 0) { fputs(", \"condition\": ", f); json_str(f, x.condition); }
  if (x.presettled) fputs(", \"presettled\": true", f);
  if (x.held) fputs(", \"held\": true", f);
  fputs("}\n", f);
  fflush(f);
}

static inline ledger_t ledger_open(const char *path, const char *client, const char *link, const char *role,
                                   const char *topic, const char *host, const char *port) {
  ledger_t l;
  memset(&l, 0, sizeof(l));
  l.f = fopen(path, "a");
  if (!l.f) { perror(path); exit(1); }
  l.client = client; l.link = link; l.role = role; l.topic = topic;
  snprintf(l.router, sizeof(l.router), "%s:%s", host, port);
  return l;
}

/* BLAKE2b-128 (hex, into out[33]) of Message(body=<string>).encode() as python-qpid-proton writes it:
   empty header and properties lists, then the amqp-value section with the string (docs/ledger.md). */
static inline void body_digest(const char *body, size_t n, char *out) {
  static const uint8_t head[] = {0x00, 0x53, 0x70, 0x45, 0x00, 0x53, 0x73, 0x45, 0x00, 0x53, 0x77};
  uint8_t len[5], d[16];
  size_t len_n, i;
  b2b_ctx c;
  if (n <= 255) { len[0] = 0xa1; len[1] = (uint8_t)n; len_n = 2; }
  else { len[0] = 0xb1; len[1] = (uint8_t)(n >> 24); len[2] = (uint8_t)(n >> 16); len[3] = (uint8_t)(n >> 8);
         len[4] = (uint8_t)n; len_n = 5; }
  b2b_init(&c, 16);
  b2b_update(&c, head, sizeof(head));
  b2b_update(&c, len, len_n);
  b2b_update(&c, body, n);
  b2b_final(&c, d);
  for (i = 0; i < 16; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

/* The string value under symbol/string key `key` in a map held by `data` (e.g. a link's remote
   properties), copied into buf; "" when absent. */
static inline void map_get_string(pn_data_t *data, const char *key, char *buf, size_t cap) {
  size_t n, i, klen = strlen(key);
  buf[0] = '\0';
  if (!data) return;
  pn_data_rewind(data);
  if (!pn_data_next(data) || pn_data_type(data) != PN_MAP) return;
  n = pn_data_get_map(data);
  pn_data_enter(data);
  for (i = 0; i + 1 < n; i += 2) {
    pn_bytes_t k = {0, NULL};
    if (!pn_data_next(data)) break;
    if (pn_data_type(data) == PN_SYMBOL) k = pn_data_get_symbol(data);
    else if (pn_data_type(data) == PN_STRING) k = pn_data_get_string(data);
    if (!pn_data_next(data)) break;
    if (k.size == klen && memcmp(k.start, key, klen) == 0) {
      pn_bytes_t v = {0, NULL};
      if (pn_data_type(data) == PN_STRING) v = pn_data_get_string(data);
      else if (pn_data_type(data) == PN_SYMBOL) v = pn_data_get_symbol(data);
      if (v.start && v.size < cap) { memcpy(buf, v.start, v.size); buf[v.size] = '\0'; }
    }
  }
  pn_data_exit(data);
}

/* The message's "seq" application property, or -1. */
static inline int64_t message_seq(pn_message_t *m) {
  pn_data_t *p = pn_message_properties(m);
  int64_t seq = -1;
  size_t n, i;
  pn_data_rewind(p);
  if (!pn_data_next(p) || pn_data_type(p) != PN_MAP) return -1;
  n = pn_data_get_map(p);
  pn_data_enter(p);
  for (i = 0; i + 1 < n; i += 2) {
    pn_bytes_t key = {0, NULL};
    if (!pn_data_next(p)) break;
    if (pn_data_type(p) == PN_STRING) key = pn_data_get_string(p);
    else if (pn_data_type(p) == PN_SYMBOL) key = pn_data_get_symbol(p);
    if (!pn_data_next(p)) break;
    if (key.size == 3 && memcmp(key.start, "seq", 3) == 0) {
      switch (pn_data_type(p)) {
       case PN_LONG: seq = pn_data_get_long(p); break;
       case PN_INT: seq = pn_data_get_int(p); break;
       case PN_ULONG: seq = (int64_t)pn_data_get_ulong(p); break;
       case PN_UINT: seq = pn_data_get_uint(p); break;
       default: break;
      }
    }
  }
  pn_data_exit(p);
  return seq;
}

/* The message's string (or binary) body, or {0, NULL}. */
static inline pn_bytes_t message_body_bytes(pn_message_t *m) {
  pn_data_t *b = pn_message_body(m);
  pn_bytes_t none = {0, NULL};
  pn_data_rewind(b);
  if (!pn_data_next(b)) return none;
  if (pn_data_type(b) == PN_STRING) return pn_data_get_string(b);
  if (pn_data_type(b) == PN_BINARY) return pn_data_get_binary(b);
  return none;
}

/* Length of the message's string (or binary) body, or -1. */
static inline long message_body_size(pn_message_t *m) {
  pn_data_t *b = pn_message_body(m);
  pn_data_rewind(b);
  if (!pn_data_next(b)) return -1;
  if (pn_data_type(b) == PN_STRING) return (long)pn_data_get_string(b).size;
  if (pn_data_type(b) == PN_BINARY) return (long)pn_data_get_binary(b).size;
  return -1;
}

#endif
