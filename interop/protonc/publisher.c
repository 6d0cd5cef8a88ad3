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
 * eorouter interop publisher, adapted from Qpid Proton C examples/c/send.c (Debian
 * libqpid-proton11-dev-examples 0.37). Contract (options, message, ledger): interop/clientkit.py.
 *
 * Changes from the original:
 *  - the message is the interop one: application property "seq" (long), a string body of --size
 *    characters "<topic>#<seq>:xxx..."; the delivery tag is the decimal seq;
 *  - every outcome is counted (accepted, rejected, released, modified), not only accepted, and written
 *    to the ledger with the rejection's condition; --settle on-outcome settles each delivery when its
 *    outcome arrives, --settle default keeps the example's behaviour (never settles: the connection
 *    close ends it), --settle presettled sends with snd-settle-mode=settled;
 *  - --container-id, --link, --disconnect-after K (exit without closing once K outcomes arrived),
 *    --timeout S (give up after S seconds without progress, exit 3);
 *  - a JSON summary line on stdout at the end.
 */

#include "ledger.h"
#include "security.h"

#include <proton/condition.h>
#include <proton/connection.h>
#include <proton/delivery.h>
#include <proton/link.h>
#include <proton/message.h>
#include <proton/proactor.h>
#include <proton/session.h>
#include <proton/transport.h>

#include "proton_loop.h"

#include <getopt.h>
#include <stdbool.h>

enum { SETTLE_ON_OUTCOME, SETTLE_DEFAULT, SETTLE_PRESETTLED };

typedef struct app_data_t {
  const char *host, *port;
  const char *amqp_address;
  const char *container_id;
  const char *link_name;
  int message_count;
  int settle;
  long size;
  long body_len;
  int disconnect_after;
  double timeout;

  security_t security; /* --tls-ca, --tls-cert/--tls-key, --user/--password, --mech (security.h) */

  ledger_t ledger;
  pn_proactor_t *proactor;
  pn_message_t *message;
  pn_rwbytes_t message_buffer;
  char *body;
  unsigned char *answered; /* per seq: outcome seen */
  int sent;
  int outcomes;
  int accepted, rejected, released, modified;
  double last_progress;
  int finished;
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
  printf("{\"stack\": \"protonc\", \"role\": \"publisher\", \"sent\": %d, \"outcomes\": {\"accepted\": %d, "
         "\"rejected\": %d, \"released\": %d, \"modified\": %d}, \"crashed\": %s, \"error\": \"",
         app->sent, app->accepted, app->rejected, app->released, app->modified, crashed ? "true" : "false");
  for (p = app->error; *p; ++p) {
    if (*p == '"' || *p == '\\') putchar('\\');
    if ((unsigned char)*p >= 0x20) putchar(*p);
  }
  printf("\"}\n");
  fflush(stdout);
}

/* Build the interop message for app->sent and send it on the current delivery. */
static void send_message(app_data_t *app, pn_link_t *sender) {
  pn_data_t *props, *body;
  char head[600];
  int n = snprintf(head, sizeof(head), "%s#%d:", app->amqp_address, app->sent);
  if (n >= (int)sizeof(head)) n = (int)sizeof(head) - 1;
  app->body_len = app->size > n ? app->size : n; /* "<topic>#<seq>:" padded with x to --size */
  memcpy(app->body, head, (size_t)n);
  if (n < app->body_len) memset(app->body + n, 'x', (size_t)(app->body_len - n));
  app->body[app->body_len] = '\0';
  pn_message_clear(app->message);
  props = pn_message_properties(app->message);
  pn_data_put_map(props);
  pn_data_enter(props);
  pn_data_put_string(props, pn_bytes(3, "seq"));
  pn_data_put_long(props, app->sent);
  pn_data_exit(props);
  body = pn_message_body(app->message);
  pn_data_put_string(body, pn_bytes((size_t)app->body_len, app->body));
  if (pn_message_send(app->message, sender, &app->message_buffer) < 0) {
    fprintf(stderr, "error sending message: %s\n", pn_error_text(pn_message_error(app->message)));
    exit(1);
  }
}

static void finish(app_data_t *app, pn_connection_t *c, int code) {
  if (!app->finished) {
    app->finished = 1;
    exit_code = code;
    pn_connection_close(c);
  }
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
     pn_link_set_snd_settle_mode(l, app->settle == SETTLE_PRESETTLED ? PN_SND_SETTLED : PN_SND_UNSETTLED);
     pn_link_open(l);
     break;
     }
   }

   case PN_LINK_REMOTE_OPEN:
     /* the router's attach: its eorouter:incarnation for our link goes on every ledger line */
     map_get_string(pn_link_remote_properties(pn_event_link(event)), "eorouter:incarnation",
                    app->ledger.incarnation, sizeof(app->ledger.incarnation));
     break;

   case PN_LINK_FLOW: {
     /* The peer has given us some credit, now we can send messages */
     pn_link_t *sender = pn_event_link(event);
     if (!pn_link_is_sender(sender)) break;
     while (pn_link_credit(sender) > 0 && app->sent < app->message_count && !app->finished) {
       char tag[24];
       pn_delivery_t *d;
       int n;
       ++app->sent;
       /* Use the decimal sequence number as the delivery tag. */
       n = snprintf(tag, sizeof(tag), "%d", app->sent);
       d = pn_delivery(sender, pn_dtag(tag, (size_t)n));
       send_message(app, sender); /* fills app->body */
       {
         char digest[33];
         body_digest(app->body, (size_t)app->body_len, digest);
         ledger_write(&app->ledger, (ledger_fields_t){.event = "sent", .seq = app->sent, .pub_tag = tag,
                                                      .pub_tag_n = (size_t)n, .digest = digest,
                                                      .size = app->body_len});
       }
       if (app->settle == SETTLE_PRESETTLED) pn_delivery_settle(d);
       app->last_progress = mono_now();
     }
     if (app->settle == SETTLE_PRESETTLED && app->sent == app->message_count)
       finish(app, pn_event_connection(event), 0);
     break;
   }

   case PN_DELIVERY: {
     /* An outcome (disposition) from the peer. */
     pn_delivery_t *d = pn_event_delivery(event);
     uint64_t state = pn_delivery_remote_state(d);
     pn_bytes_t tag = pn_delivery_tag(d);
     const char *name = NULL;
     char buf[24];
     int seq;
     if (app->settle == SETTLE_PRESETTLED) break;
     switch (state) {
      case PN_ACCEPTED: name = "accepted"; break;
      case PN_REJECTED: name = "rejected"; break;
      case PN_RELEASED: name = "released"; break;
      case PN_MODIFIED: name = "modified"; break;
      default: break;
     }
     if (!name) break; /* no terminal outcome (yet) */
     memcpy(buf, tag.start, tag.size < sizeof(buf) - 1 ? tag.size : sizeof(buf) - 1);
     buf[tag.size < sizeof(buf) - 1 ? tag.size : sizeof(buf) - 1] = '\0';
     seq = atoi(buf);
     if (seq < 1 || seq > app->message_count || app->answered[seq]) break; /* a later update (settlement) */
     app->answered[seq] = 1;
     {
       pn_condition_t *cond = pn_disposition_condition(pn_delivery_remote(d));
       ledger_write(&app->ledger, (ledger_fields_t){.event = "outcome", .seq = seq, .pub_tag = tag.start,
                    .pub_tag_n = tag.size, .outcome = name,
                    .condition = pn_condition_is_set(cond) ? pn_condition_get_name(cond) : NULL});
     }
     switch (state) {
      case PN_ACCEPTED: ++app->accepted; break;
      case PN_REJECTED: ++app->rejected; break;
      case PN_RELEASED: ++app->released; break;
      default: ++app->modified; break;
     }
     ++app->outcomes;
     app->last_progress = mono_now();
     if (app->settle == SETTLE_ON_OUTCOME) pn_delivery_settle(d);
     if (app->disconnect_after && app->outcomes >= app->disconnect_after) {
       print_summary(app, 1);
       fflush(app->ledger.f);
       _exit(0); /* drop the connection: no close frame */
     }
     if (app->outcomes == app->message_count) finish(app, pn_event_connection(event), 0);
     break;
   }

   case PN_PROACTOR_TIMEOUT:
     if (app->finished) break;
     if (mono_now() - app->last_progress > app->timeout) {
       snprintf(app->error, sizeof(app->error), "no progress for %.1f s (sent %d, outcomes %d)",
                app->timeout, app->sent, app->outcomes);
       fprintf(stderr, "publisher: %s\n", app->error);
       exit_code = 3;
       return false;
     }
     pn_proactor_set_timeout(app->proactor, 250);
     break;

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

   default: break;
  }
  return true;
}

void run(app_data_t *app) {
  EOR_RUN_PROACTOR(app->proactor, handle, app); /* eorouter_tools/c/proton_loop.h */
}

static void usage(const char *prog) {
  fprintf(stderr, "usage: %s HOST PORT TOPIC COUNT --ledger PATH [--container-id ID] [--link NAME] [--size N]\n"
                  "       [--settle on-outcome|default|presettled] [--disconnect-after K] [--timeout S]\n"
                  SECURITY_USAGE, prog);
  exit(2);
}

int main(int argc, char **argv) {
  struct app_data_t app = {0};
  char addr[PN_MAX_ADDR];
  static char container[64], link[96];
  const char *ledger_path = NULL;
  static const struct option longopts[] = {
    {"ledger", required_argument, 0, 'L'}, {"container-id", required_argument, 0, 'c'},
    {"link", required_argument, 0, 'l'}, {"size", required_argument, 0, 's'},
    {"settle", required_argument, 0, 'S'}, {"disconnect-after", required_argument, 0, 'd'},
    {"timeout", required_argument, 0, 't'},
    SECURITY_LONGOPTS, {0, 0, 0, 0}};
  int opt;

  app.size = 32;
  app.timeout = 20;
  app.settle = SETTLE_ON_OUTCOME;
  while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (opt) {
     case 'L': ledger_path = optarg; break;
     case 'c': app.container_id = optarg; break;
     case 'l': app.link_name = optarg; break;
     case 's': app.size = atol(optarg); break;
     case 'S':
      if (strcmp(optarg, "on-outcome") == 0) app.settle = SETTLE_ON_OUTCOME;
      else if (strcmp(optarg, "default") == 0) app.settle = SETTLE_DEFAULT;
      else if (strcmp(optarg, "presettled") == 0) app.settle = SETTLE_PRESETTLED;
      else usage(argv[0]);
      break;
     case 'd': app.disconnect_after = atoi(optarg); break;
     case 't': app.timeout = atof(optarg); break;
     default:
      if (!security_option(&app.security, opt, optarg)) usage(argv[0]);
    }
  }
  if (argc - optind != 4 || !ledger_path) usage(argv[0]);
  security_check(&app.security, argv[0], "publisher");
  app.host = argv[optind];
  app.port = argv[optind + 1];
  app.amqp_address = argv[optind + 2];
  app.message_count = atoi(argv[optind + 3]);
  if (!app.container_id) {
    snprintf(container, sizeof(container), "protonc-pub-%d", (int)getpid());
    app.container_id = container;
  }
  if (!app.link_name) {
    snprintf(link, sizeof(link), "%s-pub", app.container_id);
    app.link_name = link;
  }
  if (app.size < 1) app.size = 1;
  app.body = (char *)malloc((size_t)app.size + 640);
  app.answered = (unsigned char *)calloc((size_t)app.message_count + 1, 1);
  app.ledger = ledger_open(ledger_path, app.container_id, app.link_name, "publisher", app.amqp_address, app.host,
                           app.port);
  app.message = pn_message();
  app.last_progress = mono_now();

  app.proactor = pn_proactor();
  pn_proactor_addr(addr, sizeof(addr), app.host, app.port);
  security_connect(app.proactor, &app.security, app.host, addr);
  pn_proactor_set_timeout(app.proactor, 250);
  run(&app);
  print_summary(&app, 0);
  pn_proactor_free(app.proactor);
  free(app.message_buffer.start);
  pn_message_free(app.message);
  fclose(app.ledger.f);
  return exit_code;
}
