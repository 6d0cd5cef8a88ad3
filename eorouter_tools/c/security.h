/*
 * Qpid Proton C clients (interop peers, benchmark clients): the security options they share (contract:
 * interop/clientkit.py): --tls-ca PATH (TLS, trust that CA, verify the server's certificate against
 * HOST), --tls-cert PATH --tls-key PATH (a client certificate), --user NAME --password PW (a SASL
 * login), --mech MECHS (the SASL mechanisms allowed, space separated).
 *
 * Without any of them the program connects as before (pn_proactor_connect2 with no connection and no
 * transport: plain AMQP). With them it makes the connection and the transport itself:
 *  - TLS: a client pn_ssl_domain trusting --tls-ca, PN_SSL_VERIFY_PEER_NAME, the client certificate
 *    when given; pn_ssl_init + pn_ssl_set_peer_hostname(HOST) (SNI and the name check);
 *  - SASL: pn_sasl_allowed_mechs(--mech), pn_connection_set_user/password; insecure mechanisms are
 *    allowed (as python-qpid-proton's Container does) so that refusing PLAIN in clear is the router's
 *    decision, not the client's.
 * Proton C built without Cyrus SASL (Debian's libqpid-proton11) has ANONYMOUS, PLAIN and EXTERNAL
 * only: another mechanism in --mech is refused at start (exit 2, "not supported by this stack").
 */
#ifndef EOROUTER_INTEROP_SECURITY_H
#define EOROUTER_INTEROP_SECURITY_H

#include <proton/connection.h>
#include <proton/proactor.h>
#include <proton/sasl.h>
#include <proton/ssl.h>
#include <proton/transport.h>

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct security_t {
  const char *tls_ca, *tls_cert, *tls_key, *user, *password, *mech;
} security_t;

/* getopt_long values of the security options (above any short option character) */
enum { SEC_TLS_CA = 0x200, SEC_TLS_CERT, SEC_TLS_KEY, SEC_USER, SEC_PASSWORD, SEC_MECH };

/* To put in a program's longopts table, before its {0, 0, 0, 0} terminator. */
#define SECURITY_LONGOPTS                                                                        \
  {"tls-ca", required_argument, 0, SEC_TLS_CA}, {"tls-cert", required_argument, 0, SEC_TLS_CERT}, \
  {"tls-key", required_argument, 0, SEC_TLS_KEY}, {"user", required_argument, 0, SEC_USER},     \
  {"password", required_argument, 0, SEC_PASSWORD}, {"mech", required_argument, 0, SEC_MECH}

#define SECURITY_USAGE "       [--tls-ca PATH] [--tls-cert PATH --tls-key PATH] [--user NAME --password PW] [--mech MECHS]\n"

/* Take getopt_long's `opt` if it is a security option: 1 when taken, else 0. */
static inline int security_option(security_t *s, int opt, const char *arg) {
  switch (opt) {
   case SEC_TLS_CA: s->tls_ca = arg; return 1;
   case SEC_TLS_CERT: s->tls_cert = arg; return 1;
   case SEC_TLS_KEY: s->tls_key = arg; return 1;
   case SEC_USER: s->user = arg; return 1;
   case SEC_PASSWORD: s->password = arg; return 1;
   case SEC_MECH: s->mech = arg; return 1;
   default: return 0;
  }
}

static inline int security_wanted(const security_t *s) {
  return s->tls_ca || s->tls_cert || s->user || s->password || s->mech;
}

/* Exit 2 with the reason when the options do not make sense together (clientkit.security_problem),
   or name a mechanism this build of Proton C cannot do. */
static inline void security_check(const security_t *s, const char *prog, const char *role) {
  const char *problem = NULL;
  if (!s->tls_cert != !s->tls_key) problem = "--tls-cert and --tls-key go together";
  else if (s->tls_cert && !s->tls_ca) problem = "a client certificate (--tls-cert) needs TLS (--tls-ca)";
  else if (s->password && !s->user) problem = "--password needs --user";
  else if (s->mech && strspn(s->mech, " ") == strlen(s->mech)) problem = "--mech needs at least one mechanism";
  if (problem) {
    fprintf(stderr, "%s: %s\n", prog, problem);
    exit(2);
  }
  if (s->mech && !pn_sasl_extended()) {
    char copy[256], *save = NULL, *m;
    snprintf(copy, sizeof(copy), "%s", s->mech);
    for (m = strtok_r(copy, " ", &save); m; m = strtok_r(NULL, " ", &save)) {
      if (strcasecmp(m, "PLAIN") && strcasecmp(m, "EXTERNAL") && strcasecmp(m, "ANONYMOUS")) {
        fprintf(stderr, "%s: SASL mechanism %s (Proton C without Cyrus SASL has PLAIN, EXTERNAL, ANONYMOUS): "
                        "not supported by this stack\n", prog, m);
        printf("{\"stack\": \"protonc\", \"role\": \"%s\", \"error\": \"SASL mechanism %s: not supported by this "
               "stack\"}\n", role, m);
        fflush(stdout);
        exit(2);
      }
    }
  }
}

/* Connect to addr (HOST:PORT from pn_proactor_addr) with the security options; host is the name the
   server's certificate must carry. Exits 1 when the TLS files cannot be loaded. */
static inline void security_connect(pn_proactor_t *proactor, const security_t *s, const char *host, const char *addr) {
  pn_connection_t *c;
  pn_transport_t *t;
  if (!security_wanted(s)) {
    pn_proactor_connect2(proactor, NULL, NULL, addr);
    return;
  }
  c = pn_connection();
  t = pn_transport();
  if (s->tls_ca) {
    pn_ssl_domain_t *d = pn_ssl_domain(PN_SSL_MODE_CLIENT);
    pn_ssl_t *ssl;
    if (!d) { fprintf(stderr, "TLS: pn_ssl_domain failed (no TLS in this Proton C build?)\n"); exit(1); }
    if (pn_ssl_domain_set_trusted_ca_db(d, s->tls_ca)) {
      fprintf(stderr, "TLS: cannot load the trusted CA file %s\n", s->tls_ca);
      exit(1);
    }
    if (pn_ssl_domain_set_peer_authentication(d, PN_SSL_VERIFY_PEER_NAME, NULL)) {
      fprintf(stderr, "TLS: cannot ask for peer name verification\n");
      exit(1);
    }
    if (s->tls_cert && pn_ssl_domain_set_credentials(d, s->tls_cert, s->tls_key, NULL)) {
      fprintf(stderr, "TLS: cannot load the client certificate %s / key %s\n", s->tls_cert, s->tls_key);
      exit(1);
    }
    ssl = pn_ssl(t);
    if (!ssl || pn_ssl_init(ssl, d, NULL)) { fprintf(stderr, "TLS: pn_ssl_init failed\n"); exit(1); }
    pn_ssl_set_peer_hostname(ssl, host);
    pn_ssl_domain_free(d); /* the transport holds its own reference */
  }
  if (s->user || s->password || s->mech || s->tls_cert) {
    pn_sasl_t *sasl = pn_sasl(t);
    if (s->mech) pn_sasl_allowed_mechs(sasl, s->mech);
    pn_sasl_set_allow_insecure_mechs(sasl, true);
    if (s->user) pn_connection_set_user(c, s->user);
    if (s->password) pn_connection_set_password(c, s->password);
  }
  pn_proactor_connect2(proactor, c, t, addr);
}

#endif
