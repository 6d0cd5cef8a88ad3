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
 * eorouter interop subscriber, adapted from Qpid Proton C examples/c/receive.c (Debian
 * libqpid-proton11-dev-examples 0.37). Contract (options, message, ledger): interop/clientkit.py.
 *
 * Changes from the original:
 *  - --outcome accept|reject|release|modify|hold instead of always accepting; the answer and the
 *    message's "seq" application property go to the ledger instead of printing the body;
 *  - --rcv-settle-mode second: answers unsettled and settles only once the router settled (two-step),
 *    logging a "settled" event; --snd-settle-mode settled asks for pre-settled deliveries;
 *  - --credit N (the original grants COUNT), --container-id, --link, --linger S (stay attached after
 *    the last message), --disconnect-after K (exit without closing right after the K-th message),
 *    --timeout S (give up after S seconds without progress, exit 3);
 *  - prints "ready" once the router answered the attach; a JSON summary line on stdout at the end.
 */

#include "ledger.h"
#include "security.h"

#include <proton/condition.h>
#include <proton/connection.h>
#include <proton/delivery.h>
#include <proton/disposition.h>
#include <proton/link.h>
#include <proton/message.h>
#include <proton/proactor.h>
#include <proton/session.h>
#include <proton/transport.h>

#include "proton_loop.h"

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>

enum { O_ACCEPT, O_REJECT, O_RELEASE, O_MODIFY, O_HOLD };
static const char *OUTCOME_WORD[] = {"accepted", "rejected", "released", "modified", NULL};

typedef struct app_data_t {
  const char *host, *port;
  const char *amqp_address;
  const char *container_id;
  const char *link_name;
  int message_count;
  int outcome;
  int rcv_second;
  int snd_settled;
  int credit;
  int disconnect_after;
  double linger;
  double timeout;

  security_t security; /* --tls-ca, --tls-cert/--tls-key, --user/--password, --mech (security.h) */

  ledger_t ledger;
  pn_proactor_t *proactor;
  pn_connection_t *connection;
  pn_message_t *message;
  int received;
  int awaiting;             /* answered unsettled (rcv second), not yet settled by the router */
  double last_progress;
  double done_at;           /* > 0: every message received and finished; linger from here */
  int finished;
  pn_rwbytes_t msgin;       /* Partially received message */
  char error[512];
} app_data_t;

static int exit_code = 3;

static void check_condition(app_data_t *app, pn_event_t *e, pn_condition_t *cond) {
  if (pn_condition_is_set(cond)) {
    fprintf(stderr, "%s: %s: %s\n", pn_event_type_name(pn_event_type(e)),
            pn_condition_get_name(cond), pn_condition_get_description(cond));
    if (!app->error[0])
      snprintf(app->error, sizeof(app->error), "%s: %s", pn_condition_get_name(cond),
               pn_condition_get_description(cond) ? pn_condition_get_description(cond) : "");
    pn_connection_close(pn_event_connection(e));
    if (!app->finished) exit_code = 1;
  }
}

static void print_summary(app_data_t *app, int crashed) {
  const char *p;
  printf("{\"stack\": \"protonc\", \"role\": \"subscriber\", \"received\": %d, \"crashed\": %s, \"error\": \"",
         app->received, crashed ? "true" : "false");
  for (p = app->error; *p; ++p) {
    if (*p == '"' || *p == '\\') putchar('\\');
    if ((unsigned char)*p >= 0x20) putchar(*p);
  }
  printf("\"}\n");
  fflush(stdout);
}

static void check_done(app_data_t *app) {
  if (app->done_at == 0 && app->received >= app->message_count && app->awaiting == 0)
    app->done_at = mono_now();
}

static const char *state_name(uint64_t state) {
  switch (state) {
   case PN_ACCEPTED: return "accepted";
   case PN_REJECTED: return "rejected";
   case PN_RELEASED: return "released";
   case PN_MODIFIED: return "modified";
   default: return NULL;
  }
}

/* A complete message arrived on d: log it and give it our outcome. */
static void on_message(app_data_t *app, pn_delivery_t *d, pn_rwbytes_t data) {
  pn_bytes_t tag = pn_delivery_tag(d);
  int64_t seq = -1;
  long size = -1;
  char digest[33] = "";
  int err = pn_message_decode(app->message, data.start, data.size);
  free(data.start);
  if (err) {
    fprintf(stderr, "decode_message: %s\n", pn_code(err));
  } else {
    pn_bytes_t body = message_body_bytes(app->message);
    seq = message_seq(app->message);
    size = message_body_size(app->message);
    if (body.start) body_digest(body.start, body.size, digest);
  }
  ++app->received;
  app->last_progress = mono_now();
  {
  ledger_fields_t x = {.event = "delivered", .seq = seq, .delivery = tag.start, .delivery_n = tag.size,
                       .digest = digest[0] ? digest : NULL, .size = size};
  if (app->disconnect_after && app->received >= app->disconnect_after) {
    ledger_write(&app->ledger, x);
    print_summary(app, 1);
    _exit(0); /* drop the connection before answering: no disposition, no close frame */
  }
  if (pn_delivery_settled(d)) { /* pre-settled by the router (at-most-once) */
    x.presettled = 1;
    ledger_write(&app->ledger, x);
    pn_delivery_settle(d);
  } else if (app->outcome == O_HOLD) {
    x.held = 1;
    ledger_write(&app->ledger, x);
  } else {
    x.outcome = OUTCOME_WORD[app->outcome];
    ledger_write(&app->ledger, x);
    switch (app->outcome) {
     case O_REJECT:
      pn_condition_set_name(pn_disposition_condition(pn_delivery_local(d)), "interop:rejected");
      pn_condition_set_description(pn_disposition_condition(pn_delivery_local(d)),
                                   "the interop subscriber rejects");
      pn_delivery_update(d, PN_REJECTED);
      break;
     case O_RELEASE: pn_delivery_update(d, PN_RELEASED); break;
     case O_MODIFY:
      pn_disposition_set_failed(pn_delivery_local(d), true);
      pn_delivery_update(d, PN_MODIFIED);
      break;
     default: pn_delivery_update(d, PN_ACCEPTED); break;
    }
    if (app->rcv_second) {
      pn_delivery_set_context(d, (void *)(intptr_t)(seq + 1)); /* answered, awaiting the router's settle */
      ++app->awaiting;
    } else {
      pn_delivery_settle(d); /* settle and free d */
    }
  }
  }
  check_done(app);
}

/* Return true to continue, false to exit */
static bool handle(app_data_t *app, pn_event_t *event) {
  switch (pn_event_type(event)) {

   case PN_CONNECTION_INIT: {
     pn_connection_t *c = pn_event_connection(event);
     pn_session_t *s = pn_session(c);
     app->connection = c;
     pn_connection_set_container(c, app->container_id);
     pn_connection_open(c);
     pn_session_open(s);
     {
     pn_link_t *l = pn_receiver(s, app->link_name);
     pn_terminus_set_address(pn_link_source(l), app->amqp_address);
     pn_link_set_snd_settle_mode(l, app->snd_settled ? PN_SND_SETTLED : PN_SND_UNSETTLED);
     pn_link_set_rcv_settle_mode(l, app->rcv_second ? PN_RCV_SECOND : PN_RCV_FIRST);
     pn_link_open(l);
     /* cannot receive without granting credit: */
     pn_link_flow(l, app->credit);
     }
   } break;

   case PN_LINK_REMOTE_OPEN:
     printf("ready\n");
     fflush(stdout);
     break;

   case PN_DELIVERY: {
     /* A message (or part of a message) has been received, or the router settled one we answered */
     pn_delivery_t *d = pn_event_delivery(event);
     if (pn_delivery_readable(d)) {
       pn_link_t *l = pn_delivery_link(d);
       size_t size = pn_delivery_pending(d);
       pn_rwbytes_t *m = &app->msgin; /* Append data to incoming message buffer */
       ssize_t recv;
       size_t oldsize = m->size;
       m->size += size;
       m->start = (char *)realloc(m->start, m->size ? m->size : 1);
       recv = pn_link_recv(l, m->start + oldsize, size);
       if (recv == PN_ABORTED) {
         m->size = 0;           /* Forget the data we accumulated */
         pn_delivery_settle(d); /* Free the delivery so we can receive the next message */
         pn_link_flow(l, 1);    /* Replace credit for aborted message */
       } else if (recv < 0 && recv != PN_EOS) {        /* Unexpected error */
         pn_condition_format(pn_link_condition(l), "broker", "PN_DELIVERY error: %s", pn_code((int)recv));
         pn_link_close(l);               /* Unexpected error, close the link */
       } else if (!pn_delivery_partial(d)) { /* Message is complete */
         pn_rwbytes_t whole = *m;
         *m = pn_rwbytes_null;  /* Reset the buffer for the next message*/
         pn_link_advance(l);
         pn_link_flow(l, 1); /* keep the credit window */
         on_message(app, d, whole);
       }
     } else if (pn_delivery_settled(d) && pn_delivery_get_context(d)) {
       /* rcv-settle-mode=second: the router settled a delivery we answered; now we settle */
       pn_bytes_t tag = pn_delivery_tag(d);
       int64_t seq = (int64_t)(intptr_t)pn_delivery_get_context(d) - 1;
       ledger_write(&app->ledger, (ledger_fields_t){.event = "settled", .seq = seq, .delivery = tag.start,
                    .delivery_n = tag.size, .outcome = state_name(pn_delivery_remote_state(d))});
       pn_delivery_set_context(d, NULL);
       pn_delivery_settle(d);
       --app->awaiting;
       app->last_progress = mono_now();
       check_done(app);
     }
     break;
   }

   case PN_PROACTOR_TIMEOUT: {
     double now = mono_now();
     if (app->finished) break;
     if (app->done_at > 0) {
       if (now - app->done_at >= app->linger) {
         app->finished = 1;
         exit_code = 0;
         if (app->connection) {
           pn_connection_close(app->connection);
           pn_connection_wake(app->connection); /* outside its own batch: get it written */
         } else {
           return false;
         }
         break;
       }
     } else if (now - app->last_progress > app->timeout) {
       snprintf(app->error, sizeof(app->error), "no progress for %.1f s (received %d)", app->timeout,
                app->received);
       fprintf(stderr, "subscriber: %s\n", app->error);
       exit_code = 3;
       return false;
     }
     pn_proactor_set_timeout(app->proactor, 100);
     break;
   }

   case PN_TRANSPORT_CLOSED:
    check_condition(app, event, pn_transport_condition(pn_event_transport(event)));
    if (!app->finished) {
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

   default:
    break;
  }
  return true;
}

void run(app_data_t *app) {
  EOR_RUN_PROACTOR(app->proactor, handle, app); /* eorouter_tools/c/proton_loop.h */
}

static void usage(const char *prog) {
  fprintf(stderr, "usage: %s HOST PORT TOPIC COUNT --ledger PATH [--container-id ID] [--link NAME]\n"
                  "       [--outcome accept|reject|release|modify|hold] [--rcv-settle-mode first|second]\n"
                  "       [--snd-settle-mode unsettled|settled] [--credit N] [--disconnect-after K]\n"
                  "       [--linger S] [--timeout S]\n" SECURITY_USAGE, prog);
  exit(2);
}

int main(int argc, char **argv) {
  struct app_data_t app = {0};
  char addr[PN_MAX_ADDR];
  static char container[64], link[96];
  const char *ledger_path = NULL;
  static const struct option longopts[] = {
    {"ledger", required_argument, 0, 'L'}, {"container-id", required_argument, 0, 'c'},
    {"link", required_argument, 0, 'l'}, {"outcome", required_argument, 0, 'o'},
    {"rcv-settle-mode", required_argument, 0, 'r'}, {"snd-settle-mode", required_argument, 0, 'n'},
    {"credit", required_argument, 0, 'C'}, {"disconnect-after", required_argument, 0, 'd'},
    {"linger", required_argument, 0, 'g'}, {"timeout", required_argument, 0, 't'},
    SECURITY_LONGOPTS, {0, 0, 0, 0}};
  int opt;

  app.credit = 100;
  app.timeout = 20;
  app.outcome = O_ACCEPT;
  while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (opt) {
     case 'L': ledger_path = optarg; break;
     case 'c': app.container_id = optarg; break;
     case 'l': app.link_name = optarg; break;
     case 'o':
      if (strcmp(optarg, "accept") == 0) app.outcome = O_ACCEPT;
      else if (strcmp(optarg, "reject") == 0) app.outcome = O_REJECT;
      else if (strcmp(optarg, "release") == 0) app.outcome = O_RELEASE;
      else if (strcmp(optarg, "modify") == 0) app.outcome = O_MODIFY;
      else if (strcmp(optarg, "hold") == 0) app.outcome = O_HOLD;
      else usage(argv[0]);
      break;
     case 'r':
      if (strcmp(optarg, "first") == 0) app.rcv_second = 0;
      else if (strcmp(optarg, "second") == 0) app.rcv_second = 1;
      else usage(argv[0]);
      break;
     case 'n':
      if (strcmp(optarg, "unsettled") == 0) app.snd_settled = 0;
      else if (strcmp(optarg, "settled") == 0) app.snd_settled = 1;
      else usage(argv[0]);
      break;
     case 'C': app.credit = atoi(optarg); break;
     case 'd': app.disconnect_after = atoi(optarg); break;
     case 'g': app.linger = atof(optarg); break;
     case 't': app.timeout = atof(optarg); break;
     default:
      if (!security_option(&app.security, opt, optarg)) usage(argv[0]);
    }
  }
  if (argc - optind != 4 || !ledger_path) usage(argv[0]);
  security_check(&app.security, argv[0], "subscriber");
  app.host = argv[optind];
  app.port = argv[optind + 1];
  app.amqp_address = argv[optind + 2];
  app.message_count = atoi(argv[optind + 3]);
  if (!app.container_id) {
    snprintf(container, sizeof(container), "protonc-sub-%d", (int)getpid());
    app.container_id = container;
  }
  if (!app.link_name) {
    snprintf(link, sizeof(link), "%s-sub", app.container_id);
    app.link_name = link;
  }
  app.ledger = ledger_open(ledger_path, app.container_id, app.link_name, "subscriber", app.amqp_address, app.host,
                           app.port);
  app.message = pn_message();
  app.last_progress = mono_now();

  app.proactor = pn_proactor();
  pn_proactor_addr(addr, sizeof(addr), app.host, app.port);
  security_connect(app.proactor, &app.security, app.host, addr);
  pn_proactor_set_timeout(app.proactor, 100);
  run(&app);
  print_summary(&app, 0);
  pn_proactor_free(app.proactor);
  pn_message_free(app.message);
  fclose(app.ledger.f);
  return exit_code;
}
