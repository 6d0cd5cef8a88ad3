/*
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
 */

/*
 * eorouter benchmark baseline: a topic (fan-out) broker adapted from Qpid Proton C examples/c/broker.c
 * (0.37). It takes the same clients as eorouter and does the minimum a relay must do, with no delivery
 * tracking: each incoming message is accepted and settled at once and relayed pre-settled.
 *
 * Changes from the original:
 *  - fan-out instead of a shared queue: every sender link (subscriber) attached to an address gets
 *    its own bounded queue, and each incoming message is pushed to all of them (one reference-counted
 *    copy of the bytes, shared); a message for an address with no subscribers is dropped;
 *  - incoming credit window of 1000 (the original uses 5 "to show flow control"), topped up when it
 *    falls below half; back-pressure: while any subscriber queue of the address holds >= HIGH (1000)
 *    messages the publisher's credit is not topped up; the publisher's connection is woken when the
 *    queues drain below HIGH/2;
 *  - a subscriber is sent as many messages as its credit allows per event (the original sends one);
 *  - the receive buffer bug (appending a multi-frame message at the buffer start) is fixed;
 *  - no TLS (the example certificates have expired) and 1 thread by default (argv[3] sets more);
 *  - prints "listening on PORT" (PORT 0 = any free port) as the original does.
 *
 * Usage: broker HOST PORT [THREADS]
 */

#include "thread.h"

#include <proton/engine.h>
#include <proton/listener.h>
#include <proton/netaddr.h>
#include <proton/proactor.h>
#include <proton/sasl.h>
#include <proton/transport.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW 1000          /* credit granted to each publisher link */
#define HIGH 1000            /* subscriber queue length that stops publisher credit */
#define LOW (HIGH / 2)       /* ... and that restarts it */

/* Simple re-sizable vector */
#define VEC(T) struct { T* data; size_t len, cap; }

#define VEC_INIT(V)                             \
  do {                                          \
    void **vp = (void**)&V.data;                \
    V.len = 0;                                  \
    V.cap = 16;                                 \
    *vp = malloc(V.cap * sizeof(*V.data));      \
  } while(0)

#define VEC_FINAL(V) free(V.data)

#define VEC_PUSH(V, X)                                  \
  do {                                                  \
    if (V.len == V.cap) {                               \
      void **vp = (void**)&V.data;                      \
      V.cap *= 2;                                       \
      *vp = realloc(V.data, V.cap * sizeof(*V.data));   \
    }                                                   \
    V.data[V.len++] = X;                                \
  } while(0)                                            \

/* A message shared by every subscriber queue it was pushed to. */
typedef struct msg_t {
  size_t refs;
  size_t size;
  char data[];
} msg_t;

static void msg_unref(msg_t *m) {
  if (--m->refs == 0) free(m);
}

struct topic_t;

/* One subscriber (an outgoing link) with its own ring-buffer queue. */
typedef struct sub_t {
  struct sub_t *next;
  struct topic_t *topic;
  pn_link_t *link;
  pn_connection_t *conn;
  msg_t **ring;
  size_t cap, head, len;
  int waiting;                     /* had credit but nothing to send: wake on push */
  uint64_t sent;                   /* delivery tag counter */
} sub_t;

/* Connection flags, kept in the connection context (set under a topic lock, read in the connection's
   own event loop after a wake). */
#define CHECK_SEND 1
#define CHECK_CREDIT 2

typedef struct topic_t {
  pthread_mutex_t lock;
  char *name;
  sub_t *subs;
  size_t nsubs;
  VEC(pn_connection_t*) blocked;   /* publisher connections waiting for room */
  struct topic_t *next;
} topic_t;

static void set_flag(pn_connection_t *c, uintptr_t f) {
  uintptr_t *p = (uintptr_t *)pn_connection_get_context(c);
  if (p) __atomic_or_fetch(p, f, __ATOMIC_SEQ_CST);
}

static uintptr_t take_flags(pn_connection_t *c) {
  uintptr_t *p = (uintptr_t *)pn_connection_get_context(c);
  return p ? __atomic_exchange_n(p, 0, __ATOMIC_SEQ_CST) : 0;
}

static void ring_push(sub_t *s, msg_t *m) {
  if (s->len == s->cap) {
    size_t ncap = s->cap ? s->cap * 2 : 64, i;
    msg_t **nring = (msg_t **)malloc(ncap * sizeof(msg_t *));
    for (i = 0; i < s->len; ++i) nring[i] = s->ring[(s->head + i) % s->cap];
    free(s->ring);
    s->ring = nring;
    s->cap = ncap;
    s->head = 0;
  }
  s->ring[(s->head + s->len) % s->cap] = m;
  ++s->len;
}

static msg_t *ring_pop(sub_t *s) {
  msg_t *m = s->ring[s->head];
  s->head = (s->head + 1) % s->cap;
  --s->len;
  return m;
}

/* Call with the topic locked. */
static int topic_full(topic_t *t) {
  sub_t *s;
  for (s = t->subs; s; s = s->next)
    if (s->len >= HIGH) return 1;
  return 0;
}

static int topic_below_low(topic_t *t) {
  sub_t *s;
  for (s = t->subs; s; s = s->next)
    if (s->len > LOW) return 0;
  return 1;
}

static void topic_block(topic_t *t, pn_connection_t *c) {
  size_t i;
  for (i = 0; i < t->blocked.len; ++i)
    if (t->blocked.data[i] == c) return;
  VEC_PUSH(t->blocked, c);
}

static void topic_wake_blocked(topic_t *t) {
  size_t i;
  for (i = 0; i < t->blocked.len; ++i) {
    set_flag(t->blocked.data[i], CHECK_CREDIT);
    pn_connection_wake(t->blocked.data[i]);
  }
  t->blocked.len = 0;
}

/* Thread safe set of topics */
typedef struct topics_t {
  pthread_mutex_t lock;
  topic_t *topics;
} topics_t;

static void topics_init(topics_t *ts) {
  pthread_mutex_init(&ts->lock, NULL);
  ts->topics = NULL;
}

/** Get or create the named topic. */
static topic_t *topics_get(topics_t *ts, const char *name) {
  topic_t *t;
  if (!name) name = "";
  pthread_mutex_lock(&ts->lock);
  for (t = ts->topics; t && strcmp(t->name, name) != 0; t = t->next)
    ;
  if (!t) {
    t = (topic_t *)calloc(1, sizeof(topic_t));
    pthread_mutex_init(&t->lock, NULL);
    t->name = strdup(name);
    VEC_INIT(t->blocked);
    t->next = ts->topics;
    ts->topics = t;
  }
  pthread_mutex_unlock(&ts->lock);
  return t;
}

/* Forget a closed connection in every topic's blocked list. */
static void topics_forget_connection(topics_t *ts, pn_connection_t *c) {
  topic_t *t;
  pthread_mutex_lock(&ts->lock);
  for (t = ts->topics; t; t = t->next) {
    size_t i, j = 0;
    pthread_mutex_lock(&t->lock);
    for (i = 0; i < t->blocked.len; ++i)
      if (t->blocked.data[i] != c) t->blocked.data[j++] = t->blocked.data[i];
    t->blocked.len = j;
    pthread_mutex_unlock(&t->lock);
  }
  pthread_mutex_unlock(&ts->lock);
}

/* The broker implementation */
typedef struct broker_t {
  pn_proactor_t *proactor;
  size_t threads;
  const char *container_id;     /* AMQP container-id */
  topics_t topics;
} broker_t;

void broker_stop(broker_t *b) {
  /* Interrupt the proactor to stop the working threads. */
  pn_proactor_interrupt(b->proactor);
}

/* Send what the subscriber's credit allows. Called in the subscriber connection's event loop. */
static void sub_send(sub_t *s) {
  topic_t *t = s->topic;
  pn_link_t *l = s->link;
  pthread_mutex_lock(&t->lock);
  while (pn_link_credit(l) > 0 && s->len > 0) {
    msg_t *m = ring_pop(s);
    uint64_t tag = ++s->sent;
    pn_delivery_t *d = pn_delivery(l, pn_dtag((char *)&tag, sizeof(tag)));
    pn_link_send(l, m->data, m->size);
    pn_link_advance(l);
    pn_delivery_settle(d);  /* Pre-settled: unreliable, there will be no ack */
    msg_unref(m);
  }
  s->waiting = s->len == 0 && pn_link_credit(l) > 0;
  if (t->blocked.len > 0 && topic_below_low(t)) topic_wake_blocked(t);
  pthread_mutex_unlock(&t->lock);
}

static void sub_add(broker_t *b, pn_link_t *l) {
  sub_t *s = (sub_t *)calloc(1, sizeof(sub_t));
  topic_t *t = topics_get(&b->topics, pn_terminus_get_address(pn_link_source(l)));
  s->topic = t;
  s->link = l;
  s->conn = pn_session_connection(pn_link_session(l));
  pthread_mutex_lock(&t->lock);
  s->next = t->subs;
  t->subs = s;
  ++t->nsubs;
  pthread_mutex_unlock(&t->lock);
  pn_link_set_context(l, s);
}

static void sub_remove(pn_link_t *l) {
  sub_t *s = (sub_t *)pn_link_get_context(l), **pp;
  topic_t *t;
  if (!s) return;
  t = s->topic;
  pthread_mutex_lock(&t->lock);
  for (pp = &t->subs; *pp; pp = &(*pp)->next) {
    if (*pp == s) { *pp = s->next; --t->nsubs; break; }
  }
  while (s->len > 0) msg_unref(ring_pop(s));
  if (t->blocked.len > 0 && topic_below_low(t)) topic_wake_blocked(t);
  pthread_mutex_unlock(&t->lock);
  free(s->ring);
  free(s);
  pn_link_set_context(l, NULL);
}

/* Use a buffer per incoming link to accumulate message data. */
static pn_rwbytes_t *message_buffer(pn_link_t *l) {
  if (!pn_link_get_context(l)) {
    pn_link_set_context(l, calloc(1, sizeof(pn_rwbytes_t)));
  }
  return (pn_rwbytes_t *)pn_link_get_context(l);
}

/* Publish a complete message to every subscriber of the link's target. Returns true when the
   publisher may have more credit. Called in the publisher connection's event loop. */
static int topic_publish(broker_t *b, pn_link_t *l, pn_rwbytes_t *buf) {
  topic_t *t = topics_get(&b->topics, pn_terminus_get_address(pn_link_target(l)));
  int room;
  pthread_mutex_lock(&t->lock);
  if (t->nsubs > 0) {
    msg_t *m = (msg_t *)malloc(sizeof(msg_t) + buf->size);
    sub_t *s;
    m->refs = t->nsubs;
    m->size = buf->size;
    memcpy(m->data, buf->start, buf->size);
    for (s = t->subs; s; s = s->next) {
      ring_push(s, m);
      if (s->waiting) {
        s->waiting = 0;
        set_flag(s->conn, CHECK_SEND);
        pn_connection_wake(s->conn);
      }
    }
  }
  room = !topic_full(t);
  if (!room) topic_block(t, pn_session_connection(pn_link_session(l)));
  pthread_mutex_unlock(&t->lock);
  return room;
}

/* After a wake: top up the credit of this connection's publisher links whose topic has room. */
static void connection_credit(broker_t *b, pn_connection_t *c) {
  pn_link_t *l;
  for (l = pn_link_head(c, PN_LOCAL_ACTIVE | PN_REMOTE_ACTIVE); l; l = pn_link_next(l, PN_LOCAL_ACTIVE | PN_REMOTE_ACTIVE)) {
    if (pn_link_is_receiver(l)) {
      topic_t *t = topics_get(&b->topics, pn_terminus_get_address(pn_link_target(l)));
      int room;
      pthread_mutex_lock(&t->lock);
      room = !topic_full(t);
      if (!room) topic_block(t, c);
      pthread_mutex_unlock(&t->lock);
      if (room && pn_link_credit(l) < WINDOW) pn_link_flow(l, WINDOW - pn_link_credit(l));
    }
  }
}

static void connection_send(pn_connection_t *c) {
  pn_link_t *l;
  for (l = pn_link_head(c, PN_LOCAL_ACTIVE | PN_REMOTE_ACTIVE); l; l = pn_link_next(l, PN_LOCAL_ACTIVE | PN_REMOTE_ACTIVE)) {
    if (pn_link_is_sender(l) && pn_link_get_context(l)) sub_send((sub_t *)pn_link_get_context(l));
  }
}

static void connection_unsub(pn_connection_t *c) {
  pn_link_t *l;
  for (l = pn_link_head(c, 0); l != NULL; l = pn_link_next(l, 0))
    if (pn_link_is_sender(l)) sub_remove(l);
}

static void check_condition(pn_event_t *e, pn_condition_t *cond) {
  if (pn_condition_is_set(cond)) {
    printf("%s: %s: %s\n", pn_event_type_name(pn_event_type(e)),
           pn_condition_get_name(cond), pn_condition_get_description(cond));
    fflush(stdout);
  }
}

static bool handle(broker_t *b, pn_event_t *e) {
  pn_connection_t *c = pn_event_connection(e);

  switch (pn_event_type(e)) {

   case PN_LISTENER_OPEN: {
     char port[PN_MAX_ADDR];    /* Get the listening port */
     pn_netaddr_host_port(pn_listener_addr(pn_event_listener(e)), NULL, 0, port, sizeof(port));
     printf("listening on %s\n", port);
     fflush(stdout);
     break;
   }
   case PN_LISTENER_ACCEPT: {
     pn_transport_t *t = pn_transport();
     pn_transport_set_server(t); /* Must call before pn_sasl() */
     pn_sasl_allowed_mechs(pn_sasl(t), "ANONYMOUS");
     pn_listener_accept2(pn_event_listener(e), NULL, t);
     break;
   }
   case PN_CONNECTION_INIT:
     pn_connection_set_container(c, b->container_id);
     pn_connection_set_context(c, calloc(1, sizeof(uintptr_t)));
     break;

   case PN_CONNECTION_REMOTE_OPEN: {
     pn_connection_open(pn_event_connection(e)); /* Complete the open */
     break;
   }
   case PN_CONNECTION_WAKE: {
     uintptr_t flags = take_flags(c);
     if (flags & CHECK_SEND) connection_send(c);
     if (flags & CHECK_CREDIT) connection_credit(b, c);
     break;
   }
   case PN_SESSION_REMOTE_OPEN: {
     pn_session_open(pn_event_session(e));
     break;
   }
   case PN_LINK_REMOTE_OPEN: {
     pn_link_t *l = pn_event_link(e);
     if (pn_link_is_sender(l)) {
       const char *source = pn_terminus_get_address(pn_link_remote_source(l));
       pn_terminus_set_address(pn_link_source(l), source);
       pn_link_set_snd_settle_mode(l, PN_SND_SETTLED);
       sub_add(b, l);
     } else {
       const char *target = pn_terminus_get_address(pn_link_remote_target(l));
       pn_terminus_set_address(pn_link_target(l), target);
       pn_link_flow(l, WINDOW);
     }
     pn_link_open(l);
     break;
   }
   case PN_LINK_FLOW: {
     pn_link_t *l = pn_event_link(e);
     if (pn_link_is_sender(l) && pn_link_get_context(l)) sub_send((sub_t *)pn_link_get_context(l));
     break;
   }
   case PN_LINK_FINAL: {
     pn_link_t *l = pn_event_link(e);
     if (pn_link_is_sender(l)) {
       sub_remove(l);
     } else {
       pn_rwbytes_t *buf = (pn_rwbytes_t *)pn_link_get_context(l);
       if (buf) {
         free(buf->start);
         free(buf);
       }
     }
     break;
   }
   case PN_DELIVERY: {          /* Incoming message data */
     pn_delivery_t *d = pn_event_delivery(e);
     if (pn_link_is_receiver(pn_delivery_link(d)) && pn_delivery_readable(d)) {
       pn_link_t *l = pn_delivery_link(d);
       size_t size = pn_delivery_pending(d);
       pn_rwbytes_t *m = message_buffer(l); /* Append data to incoming message buffer */
       ssize_t recv;
       size_t oldsize = m->size;
       m->size += size;
       m->start = (char *)realloc(m->start, m->size);
       recv = pn_link_recv(l, m->start + oldsize, size);
       if (recv == PN_ABORTED) {
         m->size = 0;           /* Forget the data we accumulated */
         pn_delivery_settle(d); /* Free the delivery so we can receive the next message */
       } else if (recv < 0 && recv != PN_EOS) {        /* Unexpected error */
         pn_condition_format(pn_link_condition(l), "broker", "PN_DELIVERY error: %s", pn_code((int)recv));
         pn_link_close(l);               /* Unexpected error, close the link */
       } else if (!pn_delivery_partial(d)) { /* Message is complete */
         int room = topic_publish(b, l, m);
         m->size = 0;           /* Reuse the buffer for the next message */
         pn_delivery_update(d, PN_ACCEPTED);
         pn_delivery_settle(d);
         if (room && pn_link_credit(l) < WINDOW / 2) pn_link_flow(l, WINDOW - pn_link_credit(l));
       }
     }
     break;
   }

   case PN_TRANSPORT_CLOSED:
    check_condition(e, pn_transport_condition(pn_event_transport(e)));
    if (c) {
      connection_unsub(c);
      topics_forget_connection(&b->topics, c);
    }
    break;

   case PN_CONNECTION_FINAL:
    free(pn_connection_get_context(c));
    pn_connection_set_context(c, NULL);
    break;

   case PN_CONNECTION_REMOTE_CLOSE:
    check_condition(e, pn_connection_remote_condition(pn_event_connection(e)));
    pn_connection_close(pn_event_connection(e));
    break;

   case PN_SESSION_REMOTE_CLOSE:
    check_condition(e, pn_session_remote_condition(pn_event_session(e)));
    pn_session_close(pn_event_session(e));
    break;

   case PN_LINK_REMOTE_CLOSE:
   case PN_LINK_REMOTE_DETACH:
    check_condition(e, pn_link_remote_condition(pn_event_link(e)));
    if (pn_link_is_sender(pn_event_link(e))) sub_remove(pn_event_link(e));
    pn_link_close(pn_event_link(e));
    break;

   case PN_LISTENER_CLOSE:
    check_condition(e, pn_listener_condition(pn_event_listener(e)));
    broker_stop(b);
    break;

   case PN_PROACTOR_INACTIVE:   /* listener and all connections closed */
    broker_stop(b);
    break;

   case PN_PROACTOR_INTERRUPT:
    pn_proactor_interrupt(b->proactor); /* Pass along the interrupt to the other threads */
    return false;

   default:
    break;
  }
  return true;
}

static void *broker_thread(void *void_broker) {
  broker_t *b = (broker_t *)void_broker;
  bool finished = false;
  do {
    pn_event_batch_t *events = pn_proactor_wait(b->proactor);
    pn_event_t *e;
    while ((e = pn_event_batch_next(events))) {
        if (!handle(b, e)) finished = true;
    }
    pn_proactor_done(b->proactor, events);
  } while(!finished);
  return NULL;
}

int main(int argc, char **argv) {
  const char *host = (argc > 1) ? argv[1] : "";
  const char *port = (argc > 2) ? argv[2] : "amqp";

  broker_t b = {0};
  b.proactor = pn_proactor();
  topics_init(&b.topics);
  b.container_id = "eorouter-bench-broker";
  b.threads = (argc > 3) ? (size_t)atoi(argv[3]) : 1;
  if (b.threads < 1) b.threads = 1;
  {
  /* Listen on addr */
  char addr[PN_MAX_ADDR];
  pn_proactor_addr(addr, sizeof(addr), host, port);
  pn_proactor_listen(b.proactor, pn_listener(), addr, 16);
  }

  {
  /* Start n-1 threads */
  pthread_t *threads = (pthread_t *)calloc(sizeof(pthread_t), b.threads);
  size_t i;
  for (i = 0; i < b.threads-1; ++i) {
    pthread_create(&threads[i], NULL, broker_thread, &b);
  }
  broker_thread(&b);            /* Use the main thread too. */
  /* Join the other threads */
  for (i = 0; i < b.threads-1; ++i) {
    pthread_join(threads[i], NULL);
  }
  pn_proactor_free(b.proactor);
  free(threads);
  return 0;
  }
}
