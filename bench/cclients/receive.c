/*
 *
 * Licensed to the Apache Software Foundation (ASF) under one
 * or more contributor license agreements.  See the NOTICE file
 * distributed with this work for additional information
 * regarding copyright ownership.  The ASF licenses this file
 * to you under the Apache License, Version 2.0 (the
 * "License"); you may not use this file except in compliance
 * with the License.  You may obtain a copy of the License at
 *
 *   http://www.apache.org/licenses/LICENSE-2.0
 *
 * Unless required by applicable law or agreed to in writing,
 * software distributed under the License is distributed on an
 * "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY
 * KIND, either express or implied.  See the License for the
 * specific language governing permissions and limitations
 * under the License.
 *
 */

/*
 * eorouter benchmark subscriber, adapted from Qpid Proton C examples/c/receive.c (0.37).
 *
 * Changes from the original:
 *  - grants a credit window (-w, default 1000) and tops it up when it falls below half;
 *  - quiet: no printing per message; accepts and settles every message (a pre-settled delivery is
 *    just settled locally);
 *  - one reusable receive buffer; the message is not decoded: the body written by bench send.c
 *    (magic "EOBENCH1", sequence u64 BE, CLOCK_MONOTONIC send time ns u64 BE) is found by memmem,
 *    so latency = receive time - send time is recorded per message (both ends share the clock);
 *  - counts duplicates and out-of-order sequence numbers (exactly-once / order check);
 *  - prints "ready" on stderr once the peer has answered the attach, and one JSON summary line on
 *    stdout at the end: count, p50/p90/p99/max latency in microseconds, first/last receive times;
 *  - gives up after -t seconds (default 30) without a message once messages flow (60 s at least before
 *    the first one), reporting "timed_out": true;
 *  - -V decodes every message with pn_message_decode (validation; costs receiver CPU).
 *
 * Usage: receive [-w CREDIT] [-t SECONDS] [-c CONTAINER] [-l LINK] [-V] [-T CAFILE] HOST PORT ADDRESS COUNT
 */

#define _GNU_SOURCE /* memmem */
#include <proton/connection.h>
#include <proton/condition.h>
#include <proton/delivery.h>
#include <proton/link.h>
#include <proton/message.h>
#include <proton/proactor.h>
#include <proton/session.h>
#include <proton/transport.h>

#include "proton_loop.h"
#include "security.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAGIC "EOBENCH1"
#define MAGIC_LEN 8

typedef struct app_data_t {
  const char *host, *port;
  security_t security; /* -T CAFILE: TLS, the server's certificate checked against HOST (security.h) */
  const char *amqp_address;
  const char *container_id;
  const char *link_name;
  uint64_t message_count;
  int window;
  int timeout_s;            /* idle limit once messages flow */
  int first_timeout_s;      /* idle limit before the first message: max(timeout_s, 60) */
  int validate;

  pn_proactor_t *proactor;
  pn_message_t *message;    /* only with -V */
  char *buf;                /* reusable receive buffer */
  size_t buf_cap, buf_len;

  uint64_t received;
  uint64_t presettled;      /* deliveries the peer had already settled */
  uint64_t unparsed;        /* messages without the bench body */
  uint64_t invalid;         /* -V: messages that do not decode */
  uint64_t dups, out_of_order, aborted;
  uint64_t last_seq;
  unsigned char *seen;      /* bitmap of sequence numbers, 1..message_count */
  uint32_t *lat_us;         /* latency per message, microseconds */
  uint64_t lat_n, lat_cap;
  uint64_t first_ns, last_ns;
  uint64_t progress_mark;
  int idle_ticks;
  int timed_out;
  int finished;
  int ready;
  char error[512];
} app_data_t;

static int exit_code = 0;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t get_u64be(const char *p) {
  uint64_t v = 0;
  int i;
  for (i = 0; i < 8; ++i) v = (v << 8) | (unsigned char)p[i];
  return v;
}

static void check_condition(app_data_t *app, pn_event_t *e, pn_condition_t *cond) {
  if (pn_condition_is_set(cond)) {
    fprintf(stderr, "receive: %s: %s: %s\n", pn_event_type_name(pn_event_type(e)),
            pn_condition_get_name(cond), pn_condition_get_description(cond));
    if (!app->error[0])
      snprintf(app->error, sizeof(app->error), "%s: %s", pn_condition_get_name(cond),
               pn_condition_get_description(cond) ? pn_condition_get_description(cond) : "");
    pn_connection_close(pn_event_connection(e));
    if (!app->finished) exit_code = 1;
  }
}

static void record(app_data_t *app, const char *data, size_t size, uint64_t t) {
  const char *hit = (const char *)memmem(data, size, MAGIC, MAGIC_LEN);
  uint64_t seq, sent_ns;
  if (app->validate) {
    pn_message_clear(app->message);
    if (pn_message_decode(app->message, data, size) != 0) ++app->invalid;
  }
  if (!hit || (size_t)(hit - data) + MAGIC_LEN + 16 > size) {
    ++app->unparsed;
    return;
  }
  seq = get_u64be(hit + MAGIC_LEN);
  sent_ns = get_u64be(hit + MAGIC_LEN + 8);
  if (seq >= 1 && seq <= app->message_count) {
    unsigned char bit = (unsigned char)(1u << (seq & 7));
    if (app->seen[seq >> 3] & bit) ++app->dups;
    app->seen[seq >> 3] |= bit;
  }
  if (seq < app->last_seq) ++app->out_of_order;
  if (seq > app->last_seq) app->last_seq = seq;
  if (app->lat_n == app->lat_cap) {
    app->lat_cap = app->lat_cap ? app->lat_cap * 2 : 1024;
    app->lat_us = (uint32_t *)realloc(app->lat_us, app->lat_cap * sizeof(uint32_t));
  }
  {
    uint64_t us = t > sent_ns ? (t - sent_ns) / 1000 : 0;
    app->lat_us[app->lat_n++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
  }
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

static uint32_t pct(app_data_t *app, double p) {
  uint64_t i;
  if (app->lat_n == 0) return 0;
  i = (uint64_t)(p * (double)(app->lat_n - 1) + 0.5);
  return app->lat_us[i];
}

static void print_summary(app_data_t *app) {
  double mean = 0;
  uint64_t i;
  for (i = 0; i < app->lat_n; ++i) mean += app->lat_us[i];
  if (app->lat_n) mean /= (double)app->lat_n;
  qsort(app->lat_us, app->lat_n, sizeof(uint32_t), cmp_u32);
  printf("{\"role\":\"receive\",\"expected\":%" PRIu64 ",\"count\":%" PRIu64 ",\"p50_us\":%u,\"p90_us\":%u"
         ",\"p99_us\":%u,\"max_us\":%u,\"mean_us\":%.1f,\"first_ns\":%" PRIu64 ",\"last_ns\":%" PRIu64
         ",\"presettled\":%" PRIu64 ",\"dups\":%" PRIu64 ",\"out_of_order\":%" PRIu64 ",\"unparsed\":%" PRIu64
         ",\"invalid\":%" PRIu64 ",\"aborted\":%" PRIu64 ",\"timed_out\":%s,\"error\":\"",
         app->message_count, app->received, pct(app, 0.50), pct(app, 0.90), pct(app, 0.99),
         app->lat_n ? app->lat_us[app->lat_n - 1] : 0, mean, app->first_ns, app->last_ns, app->presettled,
         app->dups, app->out_of_order, app->unparsed, app->invalid, app->aborted,
         app->timed_out ? "true" : "false");
  {
    const char *p;
    for (p = app->error; *p; ++p) {
      if (*p == '"' || *p == '\\') putchar('\\');
      if ((unsigned char)*p >= 0x20) putchar(*p);
    }
  }
  printf("\"}\n");
  fflush(stdout);
}

/* Return true to continue, false to exit */
static bool handle(app_data_t *app, pn_event_t *event) {
  switch (pn_event_type(event)) {

   case PN_CONNECTION_INIT: {
     pn_connection_t *c = pn_event_connection(event);
     pn_session_t *s = pn_session(c);
     pn_connection_set_container(c, app->container_id);
     pn_connection_open(c);
     pn_session_open(s);
     {
     pn_link_t *l = pn_receiver(s, app->link_name);
     pn_terminus_set_address(pn_link_source(l), app->amqp_address);
     pn_link_open(l);
     /* cannot receive without granting credit: */
     pn_link_flow(l, app->window);
     }
   } break;

   case PN_LINK_REMOTE_OPEN: {
     if (!app->ready) {
       app->ready = 1;
       fprintf(stderr, "ready\n");
       fflush(stderr);
     }
     break;
   }

   case PN_DELIVERY: {
     /* A message (or part of a message) has been received */
     pn_delivery_t *d = pn_event_delivery(event);
     if (pn_delivery_readable(d)) {
       pn_link_t *l = pn_delivery_link(d);
       size_t size = pn_delivery_pending(d);
       ssize_t recv;
       if (app->buf_len + size > app->buf_cap) {
         app->buf_cap = (app->buf_len + size) * 2;
         app->buf = (char *)realloc(app->buf, app->buf_cap);
       }
       recv = pn_link_recv(l, app->buf + app->buf_len, size);
       if (recv == PN_ABORTED) {
         ++app->aborted;
         app->buf_len = 0;      /* Forget the data we accumulated */
         pn_delivery_settle(d); /* Free the delivery so we can receive the next message */
       } else if (recv < 0 && recv != PN_EOS) {        /* Unexpected error */
         pn_condition_format(pn_link_condition(l), "broker", "PN_DELIVERY error: %s", pn_code((int)recv));
         pn_link_close(l);               /* Unexpected error, close the link */
       } else {
         if (recv > 0) app->buf_len += (size_t)recv;
         if (!pn_delivery_partial(d)) { /* Message is complete */
           uint64_t t = now_ns();
           if (app->first_ns == 0) app->first_ns = t;
           app->last_ns = t;
           record(app, app->buf, app->buf_len, t);
           app->buf_len = 0;
           ++app->received;
           if (pn_delivery_settled(d)) {
             ++app->presettled;
           } else {
             pn_delivery_update(d, PN_ACCEPTED);
           }
           pn_delivery_settle(d);  /* settle and free d */
           if (app->message_count && app->received >= app->message_count) {
             pn_session_t *ssn = pn_link_session(l);
             app->finished = 1;
             pn_link_close(l);
             pn_session_close(ssn);
             pn_connection_close(pn_session_connection(ssn));
           } else if (pn_link_credit(l) < app->window / 2) {
             /* Grant enough credit to bring it up to the window */
             pn_link_flow(l, app->window - pn_link_credit(l));
           }
         }
       }
     }
     break;
   }

   case PN_PROACTOR_TIMEOUT: {
     if (app->finished) break;
     if (app->received != app->progress_mark) {
       app->progress_mark = app->received;
       app->idle_ticks = 0;
     } else if (++app->idle_ticks >= (app->received ? app->timeout_s : app->first_timeout_s)) {
       app->timed_out = 1;
       exit_code = 3;
       fprintf(stderr, "receive: no message for %d s (received %" PRIu64 " of %" PRIu64 "), giving up\n",
               app->idle_ticks, app->received, app->message_count);
       return false;
     }
     pn_proactor_set_timeout(app->proactor, 1000);
     break;
   }

   case PN_TRANSPORT_CLOSED:
    check_condition(app, event, pn_transport_condition(pn_event_transport(event)));
    if (!app->finished && !exit_code) {
      exit_code = 1;
      if (!app->error[0]) snprintf(app->error, sizeof(app->error), "connection closed before the end");
    }
    return false;

   case PN_CONNECTION_REMOTE_CLOSE:
    check_condition(app, event, pn_connection_remote_condition(pn_event_connection(event)));
    pn_connection_close(pn_event_connection(event));
    break;

   case PN_SESSION_REMOTE_CLOSE:
    check_condition(app, event, pn_session_remote_condition(pn_event_session(event)));
    pn_connection_close(pn_event_connection(event));
    break;

   case PN_LINK_REMOTE_CLOSE:
   case PN_LINK_REMOTE_DETACH:
    check_condition(app, event, pn_link_remote_condition(pn_event_link(event)));
    pn_connection_close(pn_event_connection(event));
    break;

   case PN_PROACTOR_INACTIVE:
    return false;
    break;

   default:
    break;
  }
  return true;
}

void run(app_data_t *app) {
  EOR_RUN_PROACTOR(app->proactor, handle, app); /* eorouter_tools/c/proton_loop.h */
}

static void usage(const char *prog) {
  fprintf(stderr, "usage: %s [-w CREDIT] [-t SECONDS] [-c CONTAINER] [-l LINK] [-V] [-T CAFILE] HOST PORT ADDRESS COUNT\n",
          prog);
  exit(2);
}

int main(int argc, char **argv) {
  struct app_data_t app = {0};
  char addr[PN_MAX_ADDR];
  int opt;

  app.container_id = "eorouter-bench-receive";
  app.link_name = "bench-receive";
  app.window = 1000;
  app.timeout_s = 30;
  while ((opt = getopt(argc, argv, "w:t:c:l:VhT:")) != -1) {
    switch (opt) {
     case 'w': app.window = atoi(optarg); break;
     case 't': app.timeout_s = atoi(optarg); break;
     case 'c': app.container_id = optarg; break;
     case 'T': app.security.tls_ca = optarg; break;
     case 'l': app.link_name = optarg; break;
     case 'V': app.validate = 1; break;
     default: usage(argv[0]);
    }
  }
  if (argc - optind != 4) usage(argv[0]);
  app.host = argv[optind];
  app.port = argv[optind + 1];
  app.amqp_address = argv[optind + 2];
  app.message_count = strtoull(argv[optind + 3], NULL, 10);
  if (app.window < 1) app.window = 1;
  if (app.timeout_s < 1) app.timeout_s = 1;
  app.first_timeout_s = app.timeout_s > 60 ? app.timeout_s : 60;
  app.seen = (unsigned char *)calloc(app.message_count / 8 + 1, 1);
  app.lat_cap = app.message_count ? app.message_count : 1024;
  app.lat_us = (uint32_t *)malloc(app.lat_cap * sizeof(uint32_t));
  if (app.validate) app.message = pn_message();

  /* Create the proactor and connect */
  app.proactor = pn_proactor();
  pn_proactor_addr(addr, sizeof(addr), app.host, app.port);
  security_connect(app.proactor, &app.security, app.host, addr);
  pn_proactor_set_timeout(app.proactor, 1000);
  run(&app);
  print_summary(&app);
  pn_proactor_free(app.proactor);
  if (app.message) pn_message_free(app.message);
  free(app.buf);
  free(app.seen);
  free(app.lat_us);
  return exit_code;
}
