/*
 * The event loop every eorouter C client runs (the benchmark's send, receive and broker,
 * the interop peers): wait for a batch of proactor events, hand each to the program's
 * handler until it says stop (returns false), give the batch back. Written once here;
 * eorouter_tools/build.py puts this directory on the include path.
 */
#ifndef EOROUTER_PROTON_LOOP_H
#define EOROUTER_PROTON_LOOP_H

#include <proton/proactor.h>
#include <stdbool.h>

/* Run HANDLER(APP, event) for every event of PROACTOR until it returns false. */
#define EOR_RUN_PROACTOR(PROACTOR, HANDLER, APP)                                  \
  do {                                                                            \
    bool eor_go_ = true;                                                          \
    while (eor_go_) {                                                             \
      pn_event_batch_t *eor_batch_ = pn_proactor_wait(PROACTOR);                  \
      pn_event_t *eor_event_;                                                     \
      while (eor_go_ && (eor_event_ = pn_event_batch_next(eor_batch_)) != NULL)   \
        eor_go_ = HANDLER(APP, eor_event_);                                       \
      pn_proactor_done(PROACTOR, eor_batch_);                                     \
    }                                                                             \
  } while (0)

#endif
