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
 * eorouter benchmark publisher, adapted from Qpid Proton C examples/c/send.c (0.37).
 *
 * Changes from the original:
 *  - sends as fast as link credit allows (the peer's credit window, e.g. 1000), and in unsettled mode
 *    also keeps at most WINDOW deliveries unsettled at a time (-w, default 1000);
 *  - two modes (-m): "unsettled" (exactly-once path: waits for every outcome, counts accepted /
 *    rejected / released / modified / other, settles each delivery when its outcome arrives) and
 *    "presettled" (best-effort: snd-settle-mode=settled, every delivery settled when sent);
 *  - the message is encoded once; its body (an AMQP data section of -s bytes, default 100) starts
 *    with the magic "EOBENCH1", the sequence number (u64 big-endian, from 1) and the send time
 *    (CLOCK_MONOTONIC ns, u64 big-endian), patched in place before each send;
 *  - delivery tags are the 8-byte sequence number; link and container names are options (-l, -c);
 *  - quiet: prints one JSON summary line on stdout at the end (errors on stderr);
 *  - gives up after -t seconds (default 30) without progress, reporting "timed_out": true.
 *
 * Usage: send [-m unsettled|presettled] [-w WINDOW] [-s SIZE] [-t SECONDS] [-c CONTAINER] [-l LINK]
 *             HOST PORT ADDRESS COUNT
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
  int presettled;
  uint64_t window;
  size_t body_size;
  int timeout_s;

  pn_proactor_t *proactor;
  char *encoded;          /* the message, encoded once */
  size_t encoded_size;
  size_t patch_offset;    /* offset of MAGIC inside encoded */

  uint64_t sent;
  uint64_t outcomes;      /* deliveries with a terminal outcome (unsettled mode) */
  uint64_t accepted, rejected, released, modified, other;
  uint64_t start_ns, end_ns;
  uint64_t progress_mark; /* sent + outcomes at the last timeout tick */
  int idle_ticks;
  int timed_out;
  int finished;
  char error[512];
} app_data_t;

static int exit_code = 0;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void put_u64be(char *p, uint64_t v) {
  int i;
  for (i = 7; i >= 0; --i) { p[i] = (char)(v & 0xff); v >>= 8; }
}

static void check_condition(app_data_t *app, pn_event_t *e, pn_condition_t *cond) {
  if (pn_condition_is_set(cond)) {
    fprintf(stderr, "send: %s: %s: %s\n", pn_event_type_name(pn_event_type(e)),
            pn_condition_get_name(cond), pn_condition_get_description(cond));
    if (!app->error[0])
      snprintf(app->error, sizeof(app->error), "%s: %s", pn_condition_get_name(cond),
               pn_condition_get_description(cond) ? pn_condition_get_description(cond) : "");
    pn_connection_close(pn_event_connection(e));
    if (!app->finished) exit_code = 1;
  }
}

/* Encode the template message once: a data section of body_size bytes starting with MAGIC. */
static void encode_template(app_data_t *app) {
  pn_message_t *m = pn_message();
  char *body = (char *)calloc(1, app->body_size);
  size_t cap = app->body_size + 256;
  char *hit;
  int err;
  memcpy(body, MAGIC, MAGIC_LEN);
  pn_message_set_inferred(m, true); /* binary body -> data section */
  pn_message_set_durable(m, false);
  pn_data_put_binary(pn_message_body(m), pn_bytes(app->body_size, body));
  for (;;) {
    app->encoded = (char *)realloc(app->encoded, cap);
    app->encoded_size = cap;
    err = pn_message_encode(m, app->encoded, &app->encoded_size);
    if (err == PN_OVERFLOW) { cap *= 2; continue; }
    if (err) { fprintf(stderr, "send: encode: %s\n", pn_code(err)); exit(1); }
    break;
  }
  hit = (char *)memmem(app->encoded, app->encoded_size, MAGIC, MAGIC_LEN);
  if (!hit) { fprintf(stderr, "send: magic not found in encoded message\n"); exit(1); }
  app->patch_offset = (size_t)(hit - app->encoded);
  free(body);
  pn_message_free(m);
}

static void send_some(app_data_t *app, pn_link_t *sender) {
  while (pn_link_credit(sender) > 0 && app->sent < app->message_count &&
         (app->presettled || app->sent - app->outcomes < app->window)) {
    uint64_t seq = ++app->sent;
    char tag[8];
    pn_delivery_t *d;
    put_u64be(tag, seq);
    d = pn_delivery(sender, pn_dtag(tag, sizeof(tag)));
    put_u64be(app->encoded + app->patch_offset + MAGIC_LEN, seq);
    put_u64be(app->encoded + app->patch_offset + MAGIC_LEN + 8, now_ns());
    if (app->start_ns == 0) app->start_ns = now_ns();
    pn_link_send(sender, app->encoded, app->encoded_size);
    pn_link_advance(sender);
    if (app->presettled) pn_delivery_settle(d);
  }
  if (app->presettled && app->sent == app->message_count && !app->finished) {
    app->finished = 1;
    app->end_ns = now_ns();
    /* Everything queued before the close frame is written first. */
    pn_link_close(sender);
    pn_connection_close(pn_session_connection(pn_link_session(sender)));
  }
}

static void print_summary(app_data_t *app) {
  printf("{\"role\":\"send\",\"mode\":\"%s\",\"count\":%" PRIu64 ",\"sent\":%" PRIu64
         ",\"accepted\":%" PRIu64 ",\"rejected\":%" PRIu64 ",\"released\":%" PRIu64
         ",\"modified\":%" PRIu64 ",\"other\":%" PRIu64 ",\"start_ns\":%" PRIu64 ",\"end_ns\":%" PRIu64
         ",\"timed_out\":%s,\"error\":\"",
         app->presettled ? "presettled" : "unsettled", app->message_count, app->sent, app->accepted,
         app->rejected, app->released, app->modified, app->other, app->start_ns, app->end_ns,
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

/* Returns true to continue, false if finished */
static bool handle(app_data_t *app, pn_event_t *event) {
  switch (pn_event_type(event)) {

   case PN_CONNECTION_INIT: {
     pn_connection_t *c = pn_event_connection(event);
     pn_session_t *s = pn_session(pn_event_connection(event));
     pn_connection_set_container(c, app->container_id);
     pn_connection_open(c);
     pn_session_open(s);
     {
     pn_link_t *l = pn_sender(s, app->link_name);
     pn_terminus_set_address(pn_link_target(l), app->amqp_address);
     pn_link_set_snd_settle_mode(l, app->presettled ? PN_SND_SETTLED : PN_SND_UNSETTLED);
     pn_link_open(l);
     break;
     }
   }

   case PN_LINK_FLOW: {
     /* The peer has given us some credit, now we can send messages */
     pn_link_t *sender = pn_event_link(event);
     if (pn_link_is_sender(sender)) send_some(app, sender);
     break;
   }

   case PN_DELIVERY: {
     /* An outcome (disposition) from the peer. */
     pn_delivery_t *d = pn_event_delivery(event);
     uint64_t state = pn_delivery_remote_state(d);
     /* any outcome, or the peer settled without one ("other") */
     bool terminal = (state != 0 && state != PN_RECEIVED) || pn_delivery_settled(d);
     if (app->presettled || !terminal) break;
     switch (state) {
      case PN_ACCEPTED: ++app->accepted; break;
      case PN_REJECTED: ++app->rejected; break;
      case PN_RELEASED: ++app->released; break;
      case PN_MODIFIED: ++app->modified; break;
      default: ++app->other; break;
     }
     ++app->outcomes;
     pn_delivery_settle(d); /* settle on outcome: the receiver may now forget it */
     if (app->outcomes == app->message_count) {
       app->finished = 1;
       app->end_ns = now_ns();
       pn_connection_close(pn_event_connection(event));
     } else {
       send_some(app, pn_delivery_link(d));
     }
     break;
   }

   case PN_PROACTOR_TIMEOUT: {
     uint64_t mark = app->sent + app->outcomes;
     if (app->finished) break;
     if (mark != app->progress_mark) {
       app->progress_mark = mark;
       app->idle_ticks = 0;
     } else if (++app->idle_ticks >= app->timeout_s) {
       app->timed_out = 1;
       exit_code = 3;
       fprintf(stderr, "send: no progress for %d s (sent %" PRIu64 ", outcomes %" PRIu64 "), giving up\n",
               app->timeout_s, app->sent, app->outcomes);
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

   default: break;
  }
  return true;
}

void run(app_data_t *app) {
  EOR_RUN_PROACTOR(app->proactor, handle, app); /* eorouter_tools/c/proton_loop.h */
}

static void usage(const char *prog) {
  fprintf(stderr,
          "usage: %s [-m unsettled|presettled] [-w WINDOW] [-s SIZE] [-t SECONDS] [-c CONTAINER] [-l LINK] [-T CAFILE]"
          " HOST PORT ADDRESS COUNT\n", prog);
  exit(2);
}

int main(int argc, char **argv) {
  struct app_data_t app = {0};
  char addr[PN_MAX_ADDR];
  int opt;

  app.container_id = "eorouter-bench-send";
  app.link_name = "bench-send";
  app.window = 1000;
  app.body_size = 100;
  app.timeout_s = 30;
  while ((opt = getopt(argc, argv, "m:w:s:t:c:l:hT:")) != -1) {
    switch (opt) {
     case 'm':
      if (strcmp(optarg, "presettled") == 0) app.presettled = 1;
      else if (strcmp(optarg, "unsettled") == 0) app.presettled = 0;
      else usage(argv[0]);
      break;
     case 'w': app.window = strtoull(optarg, NULL, 10); break;
     case 's': app.body_size = strtoull(optarg, NULL, 10); break;
     case 't': app.timeout_s = atoi(optarg); break;
     case 'c': app.container_id = optarg; break;
     case 'T': app.security.tls_ca = optarg; break;
     case 'l': app.link_name = optarg; break;
     default: usage(argv[0]);
    }
  }
  if (argc - optind != 4) usage(argv[0]);
  app.host = argv[optind];
  app.port = argv[optind + 1];
  app.amqp_address = argv[optind + 2];
  app.message_count = strtoull(argv[optind + 3], NULL, 10);
  if (app.body_size < MAGIC_LEN + 16) app.body_size = MAGIC_LEN + 16;
  if (app.window < 1) app.window = 1;
  if (app.timeout_s < 1) app.timeout_s = 1;
  encode_template(&app);

  app.proactor = pn_proactor();
  pn_proactor_addr(addr, sizeof(addr), app.host, app.port);
  security_connect(app.proactor, &app.security, app.host, addr);
  pn_proactor_set_timeout(app.proactor, 1000);
  run(&app);
  print_summary(&app);
  pn_proactor_free(app.proactor);
  free(app.encoded);
  return exit_code;
}
