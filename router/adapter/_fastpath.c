/*
 * The adapter's compiled fast path: subscribers' accepted-and-settled dispositions,
 * publishers' messages that arrive whole, and small messages' copies going out.
 *
 * At K subscribers, exactly-once relaying reads K dispositions per message, and the
 * usual one ("accepted", settled by the subscriber) needs the same steps every time:
 * find our copy, forget it, settle our side, tell the core. Done from Python that is
 * six engine calls through cffi per copy (each releasing and retaking the GIL) plus
 * the dictionary work, and it was the largest part of what exactly-once costs over
 * best-effort (docs/benchmarks.md, "The compiled fast path"). Here it is one call for
 * a whole run of such events. A publisher's message arriving whole is the same story
 * on the way in: about a dozen engine calls (is it readable, partial, aborted, how
 * large, its tag, settled, read it, move past it, ...) become part of one call; and
 * a copy on the way out, four (new delivery, send, advance, settle or hold) one; and
 * the publisher's accepted outcome, two (the disposition, the settlement) and the
 * bookkeeping around them.
 *
 * It handles only the usual cases and stops, leaving the event at the head of the
 * collector, at anything else; router/adapter/engine.py handles the rest exactly as
 * it does when this module is not built (router/adapter/fastpath.py decides which).
 *
 * Proton is not linked in: bind() looks up the functions in the cproton_ffi module
 * python-qpid-proton already loaded, so this code drives the very engine the adapter
 * drives, and needs no proton headers (the few declarations below are its public,
 * stable C API).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h> /* recv, send */
#include <sys/types.h>  /* ssize_t */

#include "../core/_attrs.h" /* get_attr, set_attr */
#include "../core/_recycle.h" /* recycled_new: MessageReceived events kept for reuse */
#include "_jsonfields.h"      /* json_fields: a line's fields as orjson writes them */
#include "_logbuffer.h"       /* LogBuffer: the event log's lines appended in place */

typedef struct { size_t size; const char *start; } pn_bytes_t; /* pn_delivery_tag_t */

static void *(*pn_collector_peek)(void *collector);
static bool (*pn_collector_pop)(void *collector);
static void *(*pn_event_delivery)(void *event);
static void *(*pn_delivery_link)(void *delivery);
static uint64_t (*pn_delivery_remote_state)(void *delivery);
static bool (*pn_delivery_settled)(void *delivery);
static void (*pn_delivery_settle)(void *delivery);
static pn_bytes_t (*pn_delivery_tag)(void *delivery);
static bool (*pn_link_is_sender)(void *link);
static void *(*pn_link_get_context)(void *link);
static void (*pn_link_set_context)(void *link, void *context);
static bool (*pn_delivery_readable)(void *delivery);
static bool (*pn_delivery_partial)(void *delivery);
static bool (*pn_delivery_aborted)(void *delivery);
static size_t (*pn_delivery_pending)(void *delivery);
static ssize_t (*pn_link_recv)(void *link, char *bytes, size_t n);
static bool (*pn_link_advance)(void *link);
static void *(*pn_delivery)(void *link, pn_bytes_t tag);
static ssize_t (*pn_link_send)(void *link, const char *bytes, size_t n);
static void (*pn_delivery_update)(void *delivery, uint64_t state);
static ssize_t (*pn_transport_capacity)(void *transport);
static char *(*pn_transport_tail)(void *transport);
static int (*pn_transport_process)(void *transport, size_t size);
static ssize_t (*pn_transport_pending)(void *transport);
static const char *(*pn_transport_head)(void *transport);
static void (*pn_transport_pop)(void *transport, size_t size);
static int (*pn_event_type)(void *event);
static void *(*pn_event_link)(void *event);
static int (*pn_link_credit)(void *link);
static bool (*pn_link_get_drain)(void *link);

static uint64_t accepted_code;
static int bound;
static PyObject *out_name; /* "out": Link.out, the link's unsettled copies by tag */
static PyObject *core_attached_name; /* "core_attached": the core has the link */
static PyObject *rx_d_name;          /* "rx_d": a multi-frame delivery in progress (None: none) */
static PyObject *max_size_name;      /* "max_size": the largest message its publisher may send */
static PyObject *streams_name;       /* "streams": large messages going out piece by piece (None: none) */
static PyObject *ptr_address_name;   /* "ptr_address": its pn_link's address (0: unknown) */
static PyObject *address_name;       /* "address": its topic */
static PyObject *conn_name;          /* "conn": its connection */
static PyObject *one;                /* 1 */
static PyObject *dead_name;          /* "dead": a connection that ended */
static PyObject *last_handle_name;   /* "_last_handle": the engine's last incoming delivery handle */
static PyObject *small_name;         /* "_small": the engine's last payload known to be small */
/* the engine's clock, and the event log's buffer state and methods (log_line) */
static PyObject *append_sub_outcomes_name; /* "append_sub_outcomes": the event log's run of sub-outcome lines */
static PyObject *received_kind; /* "received": a Received's kind */
static PyObject *completed_kind; /* "completed": a Completed's kind */
static PyObject *fields_name;   /* "fields": a Received's line fields as a dict (Received.fields) */
static PyObject *now_name, *ts_name, *run_name, *pieces_name, *seq_name, *write_name, *close_run_name, *append_name,
    *piece_name;
/* log_line's fields encoded here (json_fields) before they are copied into the line */
static json_buf line_scratch;
static int line_scratch_busy;


static PyObject *bind_proton(PyObject *self, PyObject *args)
{
    const char *path;
    unsigned long long accepted;
    if (!PyArg_ParseTuple(args, "sK", &path, &accepted))
        return NULL;
    /* RTLD_NOLOAD: the instance Python loaded, never a second copy of proton. */
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!lib) {
        PyErr_Format(PyExc_ImportError, "proton's engine is not loaded from %s: %s", path, dlerror());
        return NULL;
    }
    struct { const char *name; void **slot; } want[] = {
        {"pn_collector_peek", (void **)&pn_collector_peek},
        {"pn_collector_pop", (void **)&pn_collector_pop},
        {"pn_event_delivery", (void **)&pn_event_delivery},
        {"pn_delivery_link", (void **)&pn_delivery_link},
        {"pn_delivery_remote_state", (void **)&pn_delivery_remote_state},
        {"pn_delivery_settled", (void **)&pn_delivery_settled},
        {"pn_delivery_settle", (void **)&pn_delivery_settle},
        {"pn_delivery_tag", (void **)&pn_delivery_tag},
        {"pn_link_is_sender", (void **)&pn_link_is_sender},
        {"pn_link_get_context", (void **)&pn_link_get_context},
        {"pn_link_set_context", (void **)&pn_link_set_context},
        {"pn_delivery_readable", (void **)&pn_delivery_readable},
        {"pn_delivery_partial", (void **)&pn_delivery_partial},
        {"pn_delivery_aborted", (void **)&pn_delivery_aborted},
        {"pn_delivery_pending", (void **)&pn_delivery_pending},
        {"pn_link_recv", (void **)&pn_link_recv},
        {"pn_link_advance", (void **)&pn_link_advance},
        {"pn_delivery", (void **)&pn_delivery},
        {"pn_link_send", (void **)&pn_link_send},
        {"pn_delivery_update", (void **)&pn_delivery_update},
        {"pn_transport_capacity", (void **)&pn_transport_capacity},
        {"pn_transport_tail", (void **)&pn_transport_tail},
        {"pn_transport_process", (void **)&pn_transport_process},
        {"pn_transport_pending", (void **)&pn_transport_pending},
        {"pn_transport_head", (void **)&pn_transport_head},
        {"pn_transport_pop", (void **)&pn_transport_pop},
        {"pn_event_type", (void **)&pn_event_type},
        {"pn_event_link", (void **)&pn_event_link},
        {"pn_link_credit", (void **)&pn_link_credit},
        {"pn_link_get_drain", (void **)&pn_link_get_drain},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        void *f = dlsym(lib, want[i].name);
        if (!f) {
            dlclose(lib);
            PyErr_Format(PyExc_ImportError, "proton's engine at %s has no %s", path, want[i].name);
            return NULL;
        }
        *want[i].slot = f;
    }
    /* The handle stays open: the module (loaded by Python) is never unloaded anyway. */
    accepted_code = accepted;
    bound = 1;
    Py_RETURN_NONE;
}

static int check_bound(void)
{
    if (!bound)
        PyErr_SetString(PyExc_RuntimeError, "router.adapter._fastpath: bind() was not called");
    return bound;
}

/* set_link_id(link_address, link_id): mark a client link as the adapter's link
 * ``link_id``; 0 unmarks it. Only marked links take the fast path: a subscriber's
 * (our end sends) for its accepted dispositions, a publisher's (our end receives)
 * for its messages. */
static PyObject *set_link_id(PyObject *self, PyObject *args)
{
    unsigned long long link;
    Py_ssize_t link_id;
    if (!PyArg_ParseTuple(args, "Kn", &link, &link_id))
        return NULL;
    if (!check_bound())
        return NULL;
    if (!link || link_id < 0) {
        PyErr_SetString(PyExc_ValueError, "set_link_id: a link address and a link id >= 0");
        return NULL;
    }
    pn_link_set_context((void *)(uintptr_t)link, (void *)(intptr_t)link_id);
    Py_RETURN_NONE;
}

/* The Link a marked link's context names, if the adapter still has it (borrowed);
 * NULL with no error set: not one for the fast path. */
static PyObject *marked_link(void *link, PyObject *links, PyObject **link_id)
{
    intptr_t id = (intptr_t)pn_link_get_context(link);
    if (id <= 0)
        return NULL;
    PyObject *key = PyLong_FromSsize_t(id);
    if (!key)
        return NULL;
    PyObject *link_obj = PyDict_GetItemWithError(links, key); /* borrowed */
    if (!link_obj) {
        Py_DECREF(key);
        return NULL;
    }
    *link_id = key;
    return link_obj;
}


/* take_accepted(collector_address, links, seen, items) -> int
 *
 * Consumes, from the head of the collector, the events that are a subscriber's
 * disposition "accepted" + settled on a copy the adapter holds unsettled, and stops
 * (leaving it at the head) at the first event that is anything else. For each one,
 * as engine.py's drain() does for it: the copy leaves its link's ``out`` (tag ->
 * pn_delivery) and ``seen`` (pn_delivery -> the state last read, for the few copies
 * answered before without settling), our side is settled, and ``link_id, tag, True``
 * is appended to ``items`` for the core. ``links`` is the adapter's link_id -> Link.
 * Returns how many it consumed. */
static PyObject *take_accepted(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* (METH_FASTCALL with the checks by hand: PyArg_ParseTuple's format parsing was ~400
     * instructions a call, and this is called once per socket read) */
    if (nargs != 4 || !PyLong_Check(args[0]) || !PyDict_Check(args[1]) || !PyDict_Check(args[2]) ||
        !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "take_accepted(collector_address, links, seen, items): an int, a dict, "
                                         "a dict, a list");
        return NULL;
    }
    unsigned long long collector_address = PyLong_AsUnsignedLongLongMask(args[0]);
    PyObject *links = args[1], *seen = args[2], *items = args[3];
    if (collector_address == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (!check_bound())
        return NULL;
    void *collector = (void *)(uintptr_t)collector_address;
    void *last_link = NULL;
    PyObject *out = NULL;     /* the last link's Link.out (a new reference) */
    PyObject *link_id = NULL; /* the last link's id (a new reference) */
    Py_ssize_t taken = 0;
    for (;;) {
        void *event = pn_collector_peek(collector);
        if (!event)
            break;
        void *d = pn_event_delivery(event); /* NULL for every other kind of event */
        if (!d || pn_delivery_remote_state(d) != accepted_code || !pn_delivery_settled(d))
            break;
        void *link = pn_delivery_link(d);
        if (link != last_link) {
            if (!pn_link_is_sender(link))
                break;
            PyObject *key = NULL;
            PyObject *link_obj = marked_link(link, links, &key);
            if (!link_obj) {
                if (PyErr_Occurred())
                    goto error;
                break; /* not a marked client subscriber link, or one the adapter forgot */
            }
            PyObject *link_out = get_attr(link_obj, out_name);
            if (!link_out) {
                Py_DECREF(key);
                goto error;
            }
            if (!PyDict_Check(link_out)) {
                Py_DECREF(key);
                Py_DECREF(link_out);
                PyErr_SetString(PyExc_TypeError, "take_accepted: Link.out is not a dict");
                goto error;
            }
            Py_XSETREF(out, link_out);
            Py_XSETREF(link_id, key);
            last_link = link;
        }
        pn_bytes_t t = pn_delivery_tag(d);
        PyObject *tag = PyBytes_FromStringAndSize(t.start, (Py_ssize_t)t.size);
        if (!tag)
            goto error;
        PyObject *held = PyDict_GetItemWithError(out, tag); /* borrowed: the address we hold */
        if (!held) {
            Py_DECREF(tag);
            if (PyErr_Occurred())
                goto error;
            break; /* a copy we no longer hold (settled already, or a repeated frame) */
        }
        /* The copy we hold under this tag must be this very delivery (a tag the
         * subscriber repeated, or one we sent again, is the Python path's). */
        void *held_d = PyLong_CheckExact(held) ? PyLong_AsVoidPtr(held) : NULL;
        if (held_d != d) {
            Py_DECREF(tag);
            if (PyErr_Occurred())
                goto error;
            break;
        }
        if (PyDict_GET_SIZE(seen) > 0) { /* usually empty: no lookup at all */
            if (PyDict_DelItem(seen, held) < 0) {
                if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
                    Py_DECREF(tag);
                    goto error;
                }
                PyErr_Clear(); /* never answered before: nothing seen */
            }
        }
        if (PyDict_DelItem(out, tag) < 0) { /* ``held`` goes with it */
            Py_DECREF(tag);
            goto error;
        }
        pn_delivery_settle(d);
        int failed = PyList_Append(items, link_id) < 0 || PyList_Append(items, tag) < 0
                     || PyList_Append(items, Py_True) < 0;
        Py_DECREF(tag);
        pn_collector_pop(collector);
        taken++;
        if (failed)
            goto error; /* consumed and settled: the caller fails this connection */
    }
    Py_XDECREF(out);
    Py_XDECREF(link_id);
    return PyLong_FromSsize_t(taken);
error:
    Py_XDECREF(out);
    Py_XDECREF(link_id);
    return NULL;
}


/* take_messages(collector_address, links, items) -> int
 *
 * Consumes, from the head of the collector, the events that are a publisher's new
 * message arrived whole, and stops (leaving it at the head) at the first event that
 * is anything else. The usual one is a single transfer on a link the core has,
 * within the link's size limit, with no multi-frame delivery in progress on it: as
 * engine.py's AMQP_delivery() does for it, its bytes are read and the link moved past
 * it, and ``link_id, tag, payload, settled, delivery_address`` are appended to
 * ``items``. The caller gives each to the core, in order (Engine._messages_batch).
 * Anything else (a partial or aborted transfer, a message too large, a delivery
 * already read, a link the core does not have) stays for AMQP_delivery().
 * ``links`` is the adapter's link_id -> Link. Returns how many it consumed. */
static PyObject *take_messages(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyLong_Check(args[0]) || !PyDict_Check(args[1]) || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "take_messages(collector_address, links, items): an int, a dict, a list");
        return NULL;
    }
    unsigned long long collector_address = PyLong_AsUnsignedLongLongMask(args[0]);
    PyObject *links = args[1], *items = args[2];
    if (collector_address == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (!check_bound())
        return NULL;
    void *collector = (void *)(uintptr_t)collector_address;
    void *last_link = NULL;
    PyObject *link_id = NULL; /* the last link's id (a new reference) */
    size_t max_size = 0;      /* the last link's limit */
    Py_ssize_t taken = 0;
    for (;;) {
        void *event = pn_collector_peek(collector);
        if (!event)
            break;
        void *d = pn_event_delivery(event); /* NULL for every other kind of event */
        if (!d || !pn_delivery_readable(d) || pn_delivery_partial(d) || pn_delivery_aborted(d))
            break;
        void *link = pn_delivery_link(d);
        if (link != last_link) {
            if (pn_link_is_sender(link))
                break;
            PyObject *key = NULL;
            PyObject *link_obj = marked_link(link, links, &key);
            if (!link_obj) {
                if (PyErr_Occurred())
                    goto error;
                break; /* not marked, or a link the adapter forgot */
            }
            PyObject *attached = get_attr(link_obj, core_attached_name);
            PyObject *rx_d = attached ? get_attr(link_obj, rx_d_name) : NULL;
            PyObject *limit = rx_d ? get_attr(link_obj, max_size_name) : NULL;
            int usual = limit && attached == Py_True && rx_d == Py_None && PyLong_Check(limit);
            size_t n_limit = usual ? PyLong_AsSize_t(limit) : 0;
            Py_XDECREF(attached);
            Py_XDECREF(rx_d);
            Py_XDECREF(limit);
            if (!usual || (n_limit == (size_t)-1 && PyErr_Occurred())) {
                Py_DECREF(key);
                if (PyErr_Occurred())
                    goto error;
                break; /* the core does not have it, or a multi-frame delivery is arriving */
            }
            Py_XSETREF(link_id, key);
            max_size = n_limit;
            last_link = link;
        }
        size_t n = pn_delivery_pending(d);
        if (n > max_size)
            break; /* too large: AMQP_delivery() reports it without reading it */
        pn_bytes_t t = pn_delivery_tag(d);
        PyObject *tag = PyBytes_FromStringAndSize(t.start, (Py_ssize_t)t.size);
        if (!tag)
            goto error;
        PyObject *payload = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
        if (!payload) {
            Py_DECREF(tag);
            goto error;
        }
        ssize_t got = n ? pn_link_recv(link, PyBytes_AS_STRING(payload), n) : 0;
        if (got < 0)
            got = 0; /* as AMQP_delivery(): nothing readable is an empty message */
        if ((size_t)got != n && _PyBytes_Resize(&payload, (Py_ssize_t)got) < 0) {
            Py_DECREF(tag);
            goto error;
        }
        PyObject *settled = pn_delivery_settled(d) ? Py_True : Py_False;
        pn_link_advance(link);
        PyObject *address = PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)d);
        int failed = !address || PyList_Append(items, link_id) < 0 || PyList_Append(items, tag) < 0
                     || PyList_Append(items, payload) < 0 || PyList_Append(items, settled) < 0
                     || PyList_Append(items, address) < 0;
        Py_DECREF(tag);
        Py_DECREF(payload);
        Py_XDECREF(address);
        pn_collector_pop(collector);
        taken++;
        if (failed)
            goto error; /* read and consumed: the caller fails this connection */
    }
    Py_XDECREF(link_id);
    return PyLong_FromSsize_t(taken);
error:
    Py_XDECREF(link_id);
    return NULL;
}

/* Engine.copies_sent[topic] += 1 per copy, and Engine.outcomes_told[(topic, code)] += 1
 * per outcome told a publisher, made the dict's int anew each time (~0.55 k
 * instructions a copy, ~0.9 k an outcome with its key's tuple). While execute_commands
 * or deliver_messages runs a batch (a message's K copies come as K Forward commands in
 * a row, a run of messages' copies in turn; a batch of answers as a SendOutcome per
 * publisher delivery), a run of counts for the same key (the topic's interned str, which
 * every link of it holds; compared by value all the same) is counted here and added once,
 * when the run ends or the batch does; outside a batch (Engine.execute in Python) each
 * is added at once. So nothing is pending between calls, and nobody reads the counts
 * during a batch (the metrics and management read them from the loop, between its
 * iterations). */
typedef struct {
    PyObject *counts;  /* held: the engine's dict (NULL: nothing pending) */
    PyObject *address; /* held: the topic */
    PyObject *code;    /* held: the outcome's code, or NULL: the key is the topic alone */
    long long n;
} pending_count;
static pending_count pending_copies, pending_told;
static int batch_depth; /* batches running (execute_commands, deliver_messages) */

/* Add what ``p`` holds: 0, or -1 with the error set (nothing pending after either). */
static int flush_count(pending_count *p)
{
    PyObject *counts = p->counts, *address = p->address, *code = p->code;
    if (!counts)
        return 0;
    long long n = p->n;
    p->counts = p->address = p->code = NULL;
    p->n = 0;
    int r = -1;
    PyObject *key = code ? PyTuple_Pack(2, address, code) : Py_NewRef(address);
    PyObject *before = key ? PyDict_GetItemWithError(counts, key) : NULL; /* borrowed */
    if (key && (before || !PyErr_Occurred())) {
        PyObject *add = PyLong_FromLongLong(n);
        PyObject *count = !add ? NULL : before ? PyNumber_Add(before, add) : Py_NewRef(add);
        r = count && PyDict_SetItem(counts, key, count) == 0 ? 0 : -1;
        Py_XDECREF(add);
        Py_XDECREF(count);
    }
    Py_XDECREF(key);
    Py_DECREF(counts);
    Py_DECREF(address);
    Py_XDECREF(code);
    return r;
}

/* Both: 0, or -1 with the (first) error set; nothing pending after either. */
static int flush_counts(void)
{
    int r = flush_count(&pending_copies);
    if (r < 0) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (flush_count(&pending_told) < 0)
            PyErr_WriteUnraisable(NULL);
        PyErr_Restore(type, value, tb);
        return -1;
    }
    return flush_count(&pending_told);
}

/* Whether a and b are the same key part: the same object (links' addresses are interned:
 * router/adapter/endpoints.py), or equal strs (or ints). */
static inline int same_part(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    if (PyUnicode_CheckExact(a) && PyUnicode_CheckExact(b))
        return PyUnicode_Compare(a, b) == 0;
    if (PyLong_CheckExact(a) && PyLong_CheckExact(b))
        return PyObject_RichCompareBool(a, b, Py_EQ) == 1;
    return 0;
}

/* One more for (address[, code]) in ``counts`` through ``p``: 0, or -1 with the error set. */
static inline int count_one(pending_count *p, PyObject *counts, PyObject *address, PyObject *code)
{
    if (batch_depth && p->counts == counts && same_part(p->address, address)
        && (code == NULL ? p->code == NULL : p->code != NULL && same_part(p->code, code))) {
        p->n++;
        return 0;
    }
    if (flush_count(p) < 0)
        return -1;
    p->counts = Py_NewRef(counts);
    p->address = Py_NewRef(address);
    p->code = Py_XNewRef(code);
    p->n = 1;
    return batch_depth ? 0 : flush_count(p);
}

/* forward(state, cmd): Engine.CORE_forward, for a message smaller than STREAM_MIN on
 * a link sending no large one: a new delivery under the command's tag, its bytes, the
 * link moved past it; kept in Link.out (by its address) unless pre-settled. ``state``
 * is (links, copies_sent, touched, fallback, stream_min): the adapter's link_id ->
 * Link, its copies per topic, its connections with engine work, and CORE_forward
 * itself, called for everything else (streaming.py's large messages). */
static PyObject *forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 5 || !PyTuple_Check(args[1])
        || PyTuple_GET_SIZE(args[1]) != 4) {
        PyErr_SetString(PyExc_TypeError, "forward(state, cmd): a 5-tuple and a Forward");
        return NULL;
    }
    if (!check_bound())
        return NULL;
    PyObject *state = args[0], *cmd = args[1];
    PyObject *links = PyTuple_GET_ITEM(state, 0), *copies_sent = PyTuple_GET_ITEM(state, 1);
    PyObject *touched = PyTuple_GET_ITEM(state, 2), *fallback = PyTuple_GET_ITEM(state, 3);
    Py_ssize_t stream_min = PyLong_AsSsize_t(PyTuple_GET_ITEM(state, 4));
    if (stream_min == -1 && PyErr_Occurred())
        return NULL;
    if (!PyDict_Check(links) || !PyDict_Check(copies_sent) || !PySet_Check(touched)) {
        PyErr_SetString(PyExc_TypeError, "forward: state is (dict, dict, set, fallback, int)");
        return NULL;
    }
    PyObject *tag = PyTuple_GET_ITEM(cmd, 1), *payload = PyTuple_GET_ITEM(cmd, 2);
    PyObject *link = PyDict_GetItemWithError(links, PyTuple_GET_ITEM(cmd, 0)); /* borrowed */
    if (!link) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE; /* the link went away in this batch; the core hears of it next */
    }
    Py_INCREF(link); /* held across the calls below, which may run Python code */
    PyObject *result = NULL, *streams = NULL, *ptr = NULL, *address = NULL, *conn = NULL;
    if (!PyBytes_CheckExact(tag) || !PyBytes_CheckExact(payload) || PyBytes_GET_SIZE(payload) >= stream_min)
        goto python;
    streams = get_attr(link, streams_name);
    if (!streams)
        goto done;
    int sending_large = PyObject_IsTrue(streams);
    if (sending_large < 0)
        goto done;
    if (sending_large)
        goto python;
    ptr = get_attr(link, ptr_address_name);
    if (!ptr)
        goto done;
    void *lp = PyLong_Check(ptr) ? PyLong_AsVoidPtr(ptr) : NULL;
    if (!lp) {
        if (PyErr_Occurred())
            goto done;
        goto python; /* a link whose address the adapter did not note */
    }
    address = get_attr(link, address_name);
    if (!address)
        goto done;
    if (count_one(&pending_copies, copies_sent, address, NULL) < 0)
        goto done;
    pn_bytes_t t = {(size_t)PyBytes_GET_SIZE(tag), PyBytes_AS_STRING(tag)};
    void *d = pn_delivery(lp, t);
    pn_link_send(lp, PyBytes_AS_STRING(payload), (size_t)PyBytes_GET_SIZE(payload));
    pn_link_advance(lp);
    if (PyTuple_GET_ITEM(cmd, 3) == Py_True) {
        pn_delivery_settle(d);
    } else {
        PyObject *held = get_attr(link, out_name);
        PyObject *at = held ? PyLong_FromVoidPtr(d) : NULL;
        int failed = !at || PyObject_SetItem(held, tag, at) < 0;
        Py_XDECREF(held);
        Py_XDECREF(at);
        if (failed)
            goto done;
    }
    conn = get_attr(link, conn_name);
    if (!conn || PySet_Add(touched, conn) < 0)
        goto done;
    result = Py_NewRef(Py_None);
    goto done;
python:
    result = PyObject_CallOneArg(fallback, cmd);
done:
    Py_DECREF(link);
    Py_XDECREF(streams);
    Py_XDECREF(ptr);
    Py_XDECREF(address);
    Py_XDECREF(conn);
    return result;
}

/* send_outcome(state, cmd): Engine.CORE_send_outcome for an accepted outcome without
 * detail (the usual answer to a publisher), settling our side or not: the count of
 * outcomes told per topic, the disposition, and with the settlement the delivery
 * forgotten (Engine._forget_incoming) and settled. ``state`` is (handles, incoming,
 * outcomes_told, touched, fallback): the adapter's handle -> (delivery's address,
 * Link), address -> handle, (topic, code) -> count, its connections with engine work,
 * and CORE_send_outcome itself, called for everything else (other outcomes, a
 * delivery still arriving). */
static PyObject *send_outcome(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 5 || !PyTuple_Check(args[1])
        || PyTuple_GET_SIZE(args[1]) != 7) {
        PyErr_SetString(PyExc_TypeError, "send_outcome(state, cmd): a 5-tuple and a SendOutcome");
        return NULL;
    }
    if (!check_bound())
        return NULL;
    PyObject *state = args[0], *cmd = args[1];
    PyObject *handles = PyTuple_GET_ITEM(state, 0), *incoming = PyTuple_GET_ITEM(state, 1);
    PyObject *told = PyTuple_GET_ITEM(state, 2), *touched = PyTuple_GET_ITEM(state, 3);
    PyObject *fallback = PyTuple_GET_ITEM(state, 4);
    if (!PyDict_Check(handles) || !PyDict_Check(incoming) || !PyDict_Check(told) || !PySet_Check(touched)) {
        PyErr_SetString(PyExc_TypeError, "send_outcome: state is (dict, dict, dict, set, fallback)");
        return NULL;
    }
    PyObject *handle = PyTuple_GET_ITEM(cmd, 0), *code = PyTuple_GET_ITEM(cmd, 1), *settle = PyTuple_GET_ITEM(cmd, 2);
    if (!PyLong_CheckExact(code) || PyLong_AsUnsignedLongLongMask(code) != accepted_code
        || PyTuple_GET_ITEM(cmd, 3) != Py_None || (settle != Py_True && settle != Py_False))
        return PyObject_CallOneArg(fallback, cmd);
    PyObject *entry = PyDict_GetItemWithError(handles, handle); /* borrowed */
    if (!entry) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE; /* the publisher's link is gone, or it was pre-settled */
    }
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2)
        return PyObject_CallOneArg(fallback, cmd);
    Py_INCREF(entry); /* held across the calls below, which may run Python code */
    PyObject *d = PyTuple_GET_ITEM(entry, 0), *link = PyTuple_GET_ITEM(entry, 1);
    PyObject *result = NULL, *rx_d = NULL, *address = NULL, *conn = NULL;
    if (settle == Py_True) {
        rx_d = get_attr(link, rx_d_name);
        if (!rx_d)
            goto done;
        if (rx_d != Py_None)
            goto python; /* a multi-frame delivery in progress: CORE_send_outcome checks it is not this one */
    }
    /* its address first: nothing changes if it cannot be had */
    if (!PyLong_CheckExact(d))
        goto python;
    void *dp = PyLong_AsVoidPtr(d);
    if (!dp) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "send_outcome: a null delivery");
        goto done;
    }
    address = get_attr(link, address_name);
    if (!address || count_one(&pending_told, told, address, code) < 0)
        goto done;
    pn_delivery_update(dp, accepted_code);
    if (settle == Py_True) {
        /* Engine._forget_incoming, then our side settled */
        if (PyDict_DelItem(handles, handle) < 0 || PyDict_DelItem(incoming, d) < 0)
            goto done;
        pn_delivery_settle(dp);
    }
    conn = get_attr(link, conn_name);
    if (!conn || PySet_Add(touched, conn) < 0)
        goto done;
    result = Py_NewRef(Py_None);
    goto done;
python:
    result = PyObject_CallOneArg(fallback, cmd);
done:
    Py_DECREF(entry);
    Py_XDECREF(rx_d);
    Py_XDECREF(address);
    Py_XDECREF(conn);
    return result;
}

/* '{"seq":<n>' into head (at least 27 bytes), as "%lld" writes n; its length. */
static int seq_head(char *head, long long n)
{
    static const char prefix[] = "{\"seq\":";
    memcpy(head, prefix, sizeof prefix - 1);
    return (int)sizeof prefix - 1 + json_decimal(head + sizeof prefix - 1, n);
}

/* A Received (router/core/commands.py): its 11 values, in its fields' order. */
#define RECEIVED_VALUES 11

/* n bytes of a literal into b: 0, or -1 with MemoryError set. */
static inline int json_literal(json_buf *b, const char *s, Py_ssize_t n)
{
    if (json_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, s, (size_t)n);
    b->len += n;
    return 0;
}

/* The fields of a Received's "received" line (Received.fields) into b, as
 * json_fields(b, cmd.fields) writes them, without making the dict: 1 written, 0 not mine
 * (b->len as it was), -1 error set. */
static int json_received(json_buf *b, PyObject *cmd)
{
#define KEY(s) {s, sizeof s - 1}
    static const struct {
        const char *text;
        Py_ssize_t len;
    } keys[RECEIVED_VALUES] = {
        KEY("{\"delivery\":"), KEY(",\"topic\":"), KEY(",\"publisher\":"), KEY(",\"link_name\":"),
        KEY(",\"pub_tag\":"), KEY(",\"incarnation\":"), KEY(",\"stream_seq\":"), KEY(",\"size\":"),
        KEY(",\"settled\":false,\"owed\":"), KEY(",\"forwarded\":"), KEY(",\"routers\":")};
#undef KEY
    static const char hex[] = "0123456789abcdef";
    Py_ssize_t start = b->len;
    int r = 1;
    for (int i = 0; i < RECEIVED_VALUES && r > 0; i++) {
        PyObject *v = PyTuple_GET_ITEM(cmd, i);
        if (json_literal(b, keys[i].text, keys[i].len) < 0) {
            r = -1;
            break;
        }
        if (i == 4) { /* the publisher's tag, bytes, in hex as bytes.hex() writes it */
            if (!PyBytes_CheckExact(v)) {
                r = 0;
                break;
            }
            Py_ssize_t n = PyBytes_GET_SIZE(v);
            if (json_reserve(b, 2 * n + 2) < 0) {
                r = -1;
                break;
            }
            const unsigned char *t = (const unsigned char *)PyBytes_AS_STRING(v);
            char *o = b->data + b->len;
            *o++ = '"';
            for (Py_ssize_t k = 0; k < n; k++) {
                *o++ = hex[t[k] >> 4];
                *o++ = hex[t[k] & 15];
            }
            *o = '"';
            b->len += 2 * n + 2;
        } else {
            r = i >= 8 ? json_value(b, v) : json_scalar(b, v);
        }
    }
    if (r > 0 && json_literal(b, "}", 1) < 0)
        r = -1;
    if (r <= 0)
        b->len = start;
    return r;
}

/* A Completed (router/core/commands.py): delivery, subscriber, settled, by, deleted. */
#define COMPLETED_VALUES 5

/* The fields of a Completed's "completed" line (Completed.fields) into b, as
 * json_fields(b, cmd.fields) writes them: 1 written, 0 not mine (b->len as it was), -1
 * error set. */
static int json_completed(json_buf *b, PyObject *cmd)
{
    static const char outcome[] = ",\"outcome\":\"accepted\",\"settled\":";
    static const char pub_outcome[] = ",\"pub_outcome\":\"accepted\"";
    PyObject *by = PyTuple_GET_ITEM(cmd, 3);
    Py_ssize_t start = b->len;
    int r = json_literal(b, "{\"delivery\":", 12) < 0 ? -1 : json_scalar(b, PyTuple_GET_ITEM(cmd, 0));
    if (r > 0)
        r = json_literal(b, ",\"subscriber\":", 14) < 0 ? -1 : json_scalar(b, PyTuple_GET_ITEM(cmd, 1));
    if (r > 0)
        r = json_literal(b, outcome, sizeof outcome - 1) < 0 ? -1 : json_scalar(b, PyTuple_GET_ITEM(cmd, 2));
    if (r > 0 && json_literal(b, pub_outcome, sizeof pub_outcome - 1) < 0)
        r = -1;
    if (r > 0 && by != Py_None) {
        r = json_literal(b, ",\"by\":", 6) < 0 ? -1 : json_scalar(b, by);
        if (r > 0)
            r = json_literal(b, ",\"deleted\":", 11) < 0 ? -1 : json_scalar(b, PyTuple_GET_ITEM(cmd, 4));
    }
    if (r > 0 && json_literal(b, "}", 1) < 0)
        r = -1;
    if (r <= 0)
        b->len = start;
    return r;
}

/* Whether the kinds operators count (a frozenset: it cannot change, so the answer for
 * the two kinds a tuple command carries is kept per set) count "received" (received) or
 * "completed": 1, 0, or -1 with an error set. */
static int tuple_kind_counted(PyObject *counted, int received)
{
    static PyObject *known_set; /* held: its address cannot be another set's while here */
    static int counts_received, counts_completed;
    if (counted != known_set) {
        int r = PySet_Contains(counted, received_kind), c = r < 0 ? -1 : PySet_Contains(counted, completed_kind);
        if (c < 0)
            return -1;
        Py_INCREF(counted);
        Py_XSETREF(known_set, counted);
        counts_received = r;
        counts_completed = c;
    }
    return received ? counts_received : counts_completed;
}

/* The pieces of the log's current timestamp (EventLog._pieces, kind -> bytes) last read
 * for the two tuple kinds. A pieces dict only ever gains entries, and the log replaces
 * the whole dict when its timestamp changes (router/eventlog.py), so a kind's piece read
 * from the same dict is the same piece: kept here, with the dict held so that its
 * address stays its own. Saves a dict lookup per line. */
static PyObject *pieces_known; /* held */
static PyObject *piece_kinds[2], *piece_values[2]; /* held */

/* The kept piece of ``kind`` in ``pieces`` (borrowed), or NULL (none kept: look it up). */
static inline PyObject *known_piece(PyObject *pieces, PyObject *kind)
{
    if (pieces != pieces_known)
        return NULL;
    return kind == piece_kinds[0] ? piece_values[0] : kind == piece_kinds[1] ? piece_values[1] : NULL;
}

/* Keep ``piece`` as ``kind``'s in ``pieces`` (a dict; kind received_kind or completed_kind). */
static void keep_piece(PyObject *pieces, PyObject *kind, PyObject *piece)
{
    if (pieces != pieces_known) {
        for (int i = 0; i < 2; i++) {
            Py_CLEAR(piece_kinds[i]);
            Py_CLEAR(piece_values[i]);
        }
        Py_INCREF(pieces);
        Py_XSETREF(pieces_known, pieces);
    }
    int i = kind == received_kind ? 0 : 1;
    Py_INCREF(kind);
    Py_INCREF(piece);
    Py_XSETREF(piece_kinds[i], kind);
    Py_XSETREF(piece_values[i], piece);
}

/* log_line(state, cmd): Engine.CORE_log for a line of a kind operators do not count,
 * with EventLog.append (router/eventlog.py) inlined: the fields encoded, an open run of
 * sub-outcome lines closed first (EventLog._close_run), then '{"seq":N' + the cached
 * piece of the kind for the current timestamp + the fields without their opening
 * brace written to the log's buffer, and the seq taken. It reads and writes the event
 * log's buffer state (_run, _ts, _pieces, _seq, _write), which eventlog.py documents as
 * shared with this twin. ``state`` is (engine, eventlog, counted, dumps, fallback):
 * engine.now is the timestamp; a counted kind, a line without fields, or a timestamp
 * the log has not seen yet go to CORE_log (the fallback). */
static PyObject *log_line(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 5 || !PyTuple_Check(args[1])
        || (PyTuple_GET_SIZE(args[1]) != 2 && PyTuple_GET_SIZE(args[1]) != RECEIVED_VALUES
            && PyTuple_GET_SIZE(args[1]) != COMPLETED_VALUES)) {
        PyErr_SetString(PyExc_TypeError, "log_line(state, cmd): a 5-tuple and a Log, a Received or a Completed");
        return NULL;
    }
    PyObject *state = args[0], *cmd = args[1];
    PyObject *engine = PyTuple_GET_ITEM(state, 0), *eventlog = PyTuple_GET_ITEM(state, 1);
    PyObject *counted = PyTuple_GET_ITEM(state, 2), *dumps = PyTuple_GET_ITEM(state, 3);
    PyObject *fallback = PyTuple_GET_ITEM(state, 4);
    /* A Received or a Completed (the engine's command table gives this writer nothing
     * else of their sizes) has no dict of fields: encoded from its values, its ``fields``
     * made only where the log's encoder or append needs them. */
    Py_ssize_t values = PyTuple_GET_SIZE(cmd);
    int received = values == RECEIVED_VALUES, completed = values == COMPLETED_VALUES, tuple = received || completed;
    PyObject *kind = received ? received_kind : completed ? completed_kind : PyTuple_GET_ITEM(cmd, 0);
    PyObject *fields = tuple ? NULL : PyTuple_GET_ITEM(cmd, 1);
    if (!PyUnicode_CheckExact(kind) || !PyFrozenSet_CheckExact(counted) ||
        (!tuple && (!PyDict_CheckExact(fields) || PyDict_GET_SIZE(fields) == 0)))
        return PyObject_CallOneArg(fallback, cmd);
    int is_counted = tuple ? tuple_kind_counted(counted, received) : PySet_Contains(counted, kind);
    if (is_counted != 0)
        return is_counted < 0 ? NULL : PyObject_CallOneArg(fallback, cmd);
    PyObject *now = get_attr(engine, now_name);
    PyObject *ts = now ? get_attr(eventlog, ts_name) : NULL;
    if (!ts) {
        Py_XDECREF(now);
        return NULL;
    }
    Py_DECREF(ts); /* (compared by identity only: the log holds it) */
    if (ts != now) {
        Py_DECREF(now);
        return PyObject_CallOneArg(fallback, cmd); /* a new timestamp: append makes its pieces */
    }
    PyObject *result = NULL, *body = NULL, *run = NULL, *pieces = NULL, *piece = NULL, *seq = NULL, *next = NULL;
    PyObject *line = NULL, *write = NULL, *written = NULL, *made_fields = NULL;
    /* The fields encoded first: an error raises before anything is buffered, as append
     * does. The usual line's fields in C (the same bytes as the log's encoder, which
     * writes any other), into the scratch buffer, held until the line is written: a
     * log_line reached meanwhile (Python code runs when a run is closed or a kind's piece
     * made) finds it busy and uses the encoder. */
    const char *body_bytes = NULL;
    Py_ssize_t body_len = 0;
    int encoded = 0, holding = 0;
    if (!line_scratch_busy) {
        line_scratch.len = 0;
        encoded = received    ? json_received(&line_scratch, cmd)
                  : completed ? json_completed(&line_scratch, cmd)
                              : json_fields(&line_scratch, fields);
        if (encoded < 0)
            goto done;
        holding = line_scratch_busy = encoded;
    }
    if (encoded) {
        body_bytes = line_scratch.data;
        body_len = line_scratch.len;
    } else {
        if (tuple && !(fields = made_fields = PyObject_GetAttr(cmd, fields_name)))
            goto done;
        body = PyObject_CallOneArg(dumps, fields);
        if (!body)
            goto done;
        if (!PyBytes_Check(body) || PyBytes_GET_SIZE(body) < 2) {
            PyErr_SetString(PyExc_TypeError, "log_line: the encoder gave no JSON object");
            goto done;
        }
        body_bytes = PyBytes_AS_STRING(body);
        body_len = PyBytes_GET_SIZE(body);
    }
    run = get_attr(eventlog, run_name);
    int open_run = !run ? -1 : PyList_CheckExact(run) ? PyList_GET_SIZE(run) > 0 : PyObject_IsTrue(run);
    if (open_run < 0)
        goto done;
    if (open_run) {
        PyObject *closed = PyObject_CallMethodNoArgs(eventlog, close_run_name);
        if (!closed)
            goto done;
        Py_DECREF(closed);
        PyObject *after = get_attr(eventlog, ts_name);
        if (!after)
            goto done;
        Py_DECREF(after);
        if (after != now) { /* the run was another timestamp's: append takes it from here */
            if (!fields && !(fields = made_fields = PyObject_GetAttr(cmd, fields_name)))
                goto done;
            result = PyObject_CallMethodObjArgs(eventlog, append_name, kind, now, fields, NULL);
            goto done;
        }
    }
    pieces = get_attr(eventlog, pieces_name);
    if (!pieces)
        goto done;
    piece = known_piece(pieces, kind);
    if (piece) {
        Py_INCREF(piece);
    } else {
        piece = PyDict_Check(pieces) ? PyDict_GetItemWithError(pieces, kind) : NULL;
        if (piece) {
            Py_INCREF(piece);
        } else {
            if (PyErr_Occurred())
                goto done;
            piece = PyObject_CallMethodOneArg(eventlog, piece_name, kind); /* made and cached by the log */
            if (!piece)
                goto done;
        }
        if (tuple && PyDict_CheckExact(pieces))
            keep_piece(pieces, kind, piece);
    }
    if (!PyBytes_Check(piece)) {
        PyErr_SetString(PyExc_TypeError, "log_line: a kind's piece is not bytes");
        goto done;
    }
    seq = get_attr(eventlog, seq_name);
    int overflow = 0;
    if (!seq)
        goto done;
    long long n = PyLong_CheckExact(seq) ? PyLong_AsLongLongAndOverflow(seq, &overflow) : 0;
    if (n == -1 && PyErr_Occurred())
        goto done;
    /* past 64 bits (or not an int): append writes it (the run, if any, is closed already) */
    if (overflow || n == LLONG_MAX || !PyLong_CheckExact(seq)) {
        result = PyObject_CallOneArg(fallback, cmd);
        goto done;
    }
    if (!(next = PyLong_FromLongLong(++n)))
        goto done;
    char head[32];
    int nh = seq_head(head, n);
    Py_ssize_t np = PyBytes_GET_SIZE(piece), nb = body_len - 1;
    write = get_attr(eventlog, write_name);
    if (!write)
        goto done;
    /* The log's own buffer (router/eventlog.py's EventLog given a LogBuffer): the line copied in
     * place; any other writer (a BytesIO) is called with the line as bytes. */
    LogBuffer *buffer = logbuffer_of_write(write);
    char *o;
    if (buffer) {
        if (logbuffer_reserve(buffer, nh + np + nb + 1) < 0)
            goto done;
        o = buffer->buf.data + buffer->buf.len;
    } else {
        if (!(line = PyBytes_FromStringAndSize(NULL, nh + np + nb + 1)))
            goto done;
        o = PyBytes_AS_STRING(line);
    }
    memcpy(o, head, (size_t)nh);
    memcpy(o + nh, PyBytes_AS_STRING(piece), (size_t)np);
    memcpy(o + nh + np, body_bytes + 1, (size_t)nb);
    o[nh + np + nb] = '\n';
    if (buffer)
        buffer->buf.len += nh + np + nb + 1;
    else if (!(written = PyObject_CallOneArg(write, line)))
        goto done;
    if (set_attr(eventlog, seq_name, next) < 0)
        goto done;
    result = Py_NewRef(Py_None);
done:
    if (holding)
        line_scratch_busy = 0;
    Py_DECREF(now);
    Py_XDECREF(body);
    Py_XDECREF(run);
    Py_XDECREF(pieces);
    Py_XDECREF(piece);
    Py_XDECREF(seq);
    Py_XDECREF(next);
    Py_XDECREF(line);
    Py_XDECREF(write);
    Py_XDECREF(written);
    Py_XDECREF(made_fields);
    return result;
}

/* encode_fields(fields): what log_line writes of a line's fields when it encodes them
 * itself (bytes, as orjson.dumps gives them), or None where it leaves them to the log's
 * encoder. For the tests that hold the two to the same bytes. */
static PyObject *encode_fields(PyObject *self, PyObject *fields)
{
    json_buf b = {NULL, 0, 0};
    int r = json_fields(&b, fields);
    PyObject *result = r < 0 ? NULL : r == 0 ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize(b.data, b.len);
    PyMem_Free(b.data);
    return result;
}

typedef PyObject *(*fastcall_fn)(PyObject *, PyObject *const *, Py_ssize_t);

/* The command table's compiled entries are functools.partial(f, state) of this module's
 * log_line, forward and send_outcome (fastpath.py): called through the partial, each
 * command paid ~150 instructions of call machinery (the partial's argument array, two
 * vectorcalls) before f began. The entries met are resolved once, by identity, into f
 * and state (an entry holds its handler, so the address cannot be another object's
 * while it is here), and called directly; anything else is called as it is. */
#define DIRECT_HANDLERS 8

static struct {
    PyObject *handler; /* held */
    fastcall_fn fn;    /* NULL: called as it is */
    PyObject *state;   /* held */
} direct_handlers[DIRECT_HANDLERS];
static unsigned direct_next; /* the entry a new handler takes when all are used */
static PyTypeObject *partial_type; /* functools.partial */

/* The entry for ``handler`` (its C function and state, or fn NULL: call it as it is),
 * resolved on first sight: 0, or -1 with an error set. */
static int direct_handler(PyObject *handler, fastcall_fn *fn, PyObject **state)
{
    for (int i = 0; i < DIRECT_HANDLERS; i++) {
        if (direct_handlers[i].handler == handler) {
            *fn = direct_handlers[i].fn;
            *state = direct_handlers[i].state;
            return 0;
        }
    }
    fastcall_fn found = NULL;
    PyObject *bound = NULL;
    if (Py_TYPE(handler) == partial_type) { /* (a subclass may call otherwise) */
        PyObject *func = PyObject_GetAttrString(handler, "func");
        PyObject *args = func ? PyObject_GetAttrString(handler, "args") : NULL;
        PyObject *kw = args ? PyObject_GetAttrString(handler, "keywords") : NULL;
        if (!kw) {
            Py_XDECREF(func);
            Py_XDECREF(args);
            return -1;
        }
        if (PyCFunction_Check(func) && PyCFunction_GET_FLAGS(func) == METH_FASTCALL && PyTuple_Check(args)
            && PyTuple_GET_SIZE(args) == 1 && PyDict_Check(kw) && PyDict_GET_SIZE(kw) == 0) {
            PyCFunction f = PyCFunction_GET_FUNCTION(func);
            if (f == (PyCFunction)(void (*)(void))log_line || f == (PyCFunction)(void (*)(void))forward
                || f == (PyCFunction)(void (*)(void))send_outcome) {
                found = (fastcall_fn)(void (*)(void))f;
                bound = Py_NewRef(PyTuple_GET_ITEM(args, 0));
            }
        }
        Py_DECREF(func);
        Py_DECREF(args);
        Py_DECREF(kw);
    }
    unsigned at = direct_next++ % DIRECT_HANDLERS;
    PyObject *old_handler = direct_handlers[at].handler, *old_state = direct_handlers[at].state;
    direct_handlers[at].handler = Py_NewRef(handler);
    direct_handlers[at].fn = found;
    direct_handlers[at].state = bound;
    Py_XDECREF(old_handler); /* (last: the entry is whole before any object is freed) */
    Py_XDECREF(old_state);
    *fn = found;
    *state = bound;
    return 0;
}

static int run_commands(PyObject *engine, PyObject *commands, PyObject *handlers);

/* The end of a batch begun by ``batch_depth++``: at the outermost, the counts left
 * pending (count_one) added, whatever happened. ``failed``: the batch's error is set,
 * and stays the one raised. 0, or -1 with the error set. */
static int batch_end(int failed)
{
    if (--batch_depth > 0)
        return failed ? -1 : 0;
    if (failed) { /* the batch's error first; the counts are added all the same */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (flush_counts() < 0)
            PyErr_WriteUnraisable(NULL);
        PyErr_Restore(type, value, tb);
        return -1;
    }
    return flush_counts();
}

/* Engine.execute(commands) for a list, as a batch. */
static int execute_commands(PyObject *engine, PyObject *commands, PyObject *handlers)
{
    batch_depth++;
    return batch_end(run_commands(engine, commands, handlers) < 0);
}

/* Engine.execute(commands) for a list: each command by the engine's command table
 * (``handlers``, class -> callable; its compiled entries are C calls), in order, the
 * last payload known to be small forgotten first. 0, or -1 with the error set (an
 * unknown command is a TypeError, as execute() raises). */
static int run_commands(PyObject *engine, PyObject *commands, PyObject *handlers)
{
    if (PyList_GET_SIZE(commands) == 0)
        return 0;
    if (set_attr(engine, small_name, Py_None) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(commands); i++) {
        PyObject *cmd = PyList_GET_ITEM(commands, i);
        PyObject *handler = PyDict_GetItemWithError(handlers, (PyObject *)Py_TYPE(cmd)); /* borrowed */
        if (!handler) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "unknown core command %R", cmd);
            return -1;
        }
        fastcall_fn fn;
        PyObject *state;
        Py_INCREF(handler); /* (the table may change while the command runs) */
        if (direct_handler(handler, &fn, &state) < 0) {
            Py_DECREF(handler);
            return -1;
        }
        Py_INCREF(cmd);
        PyObject *r;
        if (fn) {
            PyObject *call_args[2] = {Py_NewRef(state), cmd};
            r = fn(NULL, call_args, 2); /* (none of the three reads its module) */
            Py_DECREF(state);
        } else {
            r = PyObject_CallOneArg(handler, cmd);
        }
        Py_DECREF(handler);
        Py_DECREF(cmd);
        if (!r)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* deliver_answers(state, items, conn): Engine._accepted_batch, the subscribers' accepted
 * answers take_accepted read (``link_id, tag, settled`` each, all of ``conn``) to the
 * core in one call and its commands carried out: a lone SubOutcomes (the usual answer at
 * K > 1) as the event log's run of sub-outcome lines, anything else by the command
 * table. ``state`` is (engine, accepted_batch, eventlog, SubOutcomes, command_handlers,
 * failed): the core's accepted_batch(items, now, out), and the engine's method for an
 * error from it (``failed(out, exc, conn)``: what came before carried out, logged, the
 * connection closed). ``items`` is left as it was. */
static PyObject *deliver_answers(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 6 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "deliver_answers(state, items, conn): a 6-tuple, a list, a Conn");
        return NULL;
    }
    PyObject *state = args[0], *items = args[1], *conn = args[2];
    PyObject *engine = PyTuple_GET_ITEM(state, 0), *accepted_batch = PyTuple_GET_ITEM(state, 1);
    PyObject *eventlog = PyTuple_GET_ITEM(state, 2), *sub_outcomes_type = PyTuple_GET_ITEM(state, 3);
    PyObject *handlers = PyTuple_GET_ITEM(state, 4), *failed = PyTuple_GET_ITEM(state, 5);
    if (!PyDict_Check(handlers)) {
        PyErr_SetString(PyExc_TypeError, "deliver_answers: the command table is not a dict");
        return NULL;
    }
    PyObject *result = NULL, *answered = NULL;
    PyObject *out = PyList_New(0);
    PyObject *now = out ? get_attr(engine, now_name) : NULL;
    if (!now)
        goto done;
    PyObject *call_args[3] = {items, now, out};
    answered = PyObject_Vectorcall(accepted_batch, call_args, 3, NULL);
    if (!answered) {
        PyObject *type, *err, *tb;
        PyErr_Fetch(&type, &err, &tb);
        PyErr_NormalizeException(&type, &err, &tb);
        if (tb)
            PyException_SetTraceback(err, tb);
        result = PyObject_CallFunctionObjArgs(failed, out, err, conn, NULL);
        Py_XDECREF(type);
        Py_XDECREF(err);
        Py_XDECREF(tb);
        goto done;
    }
    if (PyList_GET_SIZE(out) == 1 && Py_TYPE(PyList_GET_ITEM(out, 0)) == (PyTypeObject *)sub_outcomes_type
        && PyTuple_Check(PyList_GET_ITEM(out, 0)) && PyTuple_GET_SIZE(PyList_GET_ITEM(out, 0)) == 4) {
        /* eventlog.append_sub_outcomes(now, deliveries, subscriber, outcome, settled) */
        PyObject *cmd = PyList_GET_ITEM(out, 0);
        PyObject *method_args[6] = {eventlog, now, PyTuple_GET_ITEM(cmd, 0), PyTuple_GET_ITEM(cmd, 1),
                                    PyTuple_GET_ITEM(cmd, 2), PyTuple_GET_ITEM(cmd, 3)};
        result = PyObject_VectorcallMethod(append_sub_outcomes_name, method_args, 6 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                           NULL);
        goto done;
    }
    if (execute_commands(engine, out, handlers) < 0)
        goto done;
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(out);
    Py_XDECREF(now);
    Py_XDECREF(answered);
    return result;
}

/* One message to the core and its commands executed (Engine.dispatch and
 * Engine.execute): 0, or -1 with the error set that the caller's ``failed`` hears of.
 * A ProtocolError from the core is answered on the link (``refused``), as dispatch()
 * answers it; one from executing the commands is an error like any other. */
static int dispatch_message(PyObject *engine, PyObject *event, PyObject *link, PyObject *handle_message,
                            PyObject *handlers, PyObject *refused, PyObject *protocol_error)
{
    PyObject *now = get_attr(engine, now_name);
    if (!now)
        return -1;
    PyObject *call_args[2] = {event, now};
    PyObject *commands = PyObject_Vectorcall(handle_message, call_args, 2, NULL);
    Py_DECREF(now);
    if (!commands) {
        if (!PyErr_ExceptionMatches(protocol_error))
            return -1;
        PyObject *type, *err, *tb;
        PyErr_Fetch(&type, &err, &tb);
        PyErr_NormalizeException(&type, &err, &tb);
        if (tb)
            PyException_SetTraceback(err, tb);
        PyObject *r = PyObject_CallFunctionObjArgs(refused, event, link, err, NULL);
        Py_XDECREF(type);
        Py_XDECREF(err);
        Py_XDECREF(tb);
        Py_XDECREF(r);
        return r ? 0 : -1;
    }
    int result = 0;
    if (!PyList_Check(commands)) {
        PyErr_SetString(PyExc_TypeError, "the core's handle_message gave no list");
        result = -1;
    } else {
        result = execute_commands(engine, commands, handlers);
    }
    Py_DECREF(commands);
    return result;
}

/* deliver_messages(state, items, conn): Engine._messages_batch, dispatch and execute
 * for the publishers' messages take_messages read (``link_id, tag, payload, settled,
 * delivery_address`` each), in order: each becomes the core's MessageReceived under a
 * new handle (kept in ``incoming``/``handles`` unless pre-settled), goes to the core,
 * and the commands it answers are executed by the engine's command table (its
 * compiled entries are C calls). ``state`` is (engine, links, incoming, handles,
 * MessageReceived, handle_message, command_handlers, refused, failed, ProtocolError):
 * the engine's maps (a delivery kept by its address), the core's handle_message, and the
 * engine's methods for a ProtocolError (``refused(event, link, err)``) and for any
 * other error (``failed(conn, exc)``: logged, the connection closed, the next
 * message handled as the Python loop handles it). ``items`` is left as it was. All of
 * it is one batch (count_one): the run's copies and answers counted once, at its end. */
static PyObject *deliver_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

static PyObject *deliver_messages(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    batch_depth++;
    PyObject *result = deliver_run(self, args, nargs);
    if (batch_end(result == NULL) < 0)
        Py_CLEAR(result);
    return result;
}

static PyObject *deliver_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 10 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "deliver_messages(state, items, conn): a 10-tuple, a list, a Conn");
        return NULL;
    }
    if (!check_bound())
        return NULL;
    PyObject *state = args[0], *items = args[1], *conn = args[2];
    PyObject *engine = PyTuple_GET_ITEM(state, 0), *links = PyTuple_GET_ITEM(state, 1);
    PyObject *incoming = PyTuple_GET_ITEM(state, 2), *handles = PyTuple_GET_ITEM(state, 3);
    PyObject *message_type = PyTuple_GET_ITEM(state, 4), *handle_message = PyTuple_GET_ITEM(state, 5);
    PyObject *handlers = PyTuple_GET_ITEM(state, 6), *refused = PyTuple_GET_ITEM(state, 7);
    PyObject *failed = PyTuple_GET_ITEM(state, 8), *protocol_error = PyTuple_GET_ITEM(state, 9);
    if (!PyDict_Check(links) || !PyDict_Check(incoming) || !PyDict_Check(handles) || !PyDict_Check(handlers)
        || !PyType_Check(message_type) || !PyType_IsSubtype((PyTypeObject *)message_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "deliver_messages: state's maps are dicts, MessageReceived a tuple type");
        return NULL;
    }
    if (recycle_install((PyTypeObject *)message_type, 0, 5) < 0) /* (once: installed, it does nothing) */
        return NULL;
    for (Py_ssize_t i = 0; i + 5 <= PyList_GET_SIZE(items); i += 5) {
        PyObject *dead = get_attr(conn, dead_name);
        int is_dead = dead ? PyObject_IsTrue(dead) : -1;
        Py_XDECREF(dead);
        if (is_dead < 0)
            return NULL;
        if (is_dead)
            break; /* the connection's end frees the rest, never answered: the publisher sends them again */
        PyObject *link_id = PyList_GET_ITEM(items, i), *tag = PyList_GET_ITEM(items, i + 1);
        PyObject *payload = PyList_GET_ITEM(items, i + 2), *settled = PyList_GET_ITEM(items, i + 3);
        unsigned long long address = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(items, i + 4));
        if (address == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
        void *d = (void *)(uintptr_t)address;
        PyObject *link = PyDict_GetItemWithError(links, link_id); /* borrowed */
        int attached = 0;
        if (link) {
            PyObject *a = get_attr(link, core_attached_name);
            attached = a ? PyObject_IsTrue(a) : -1;
            Py_XDECREF(a);
        }
        if (attached < 0 || (!link && PyErr_Occurred()))
            return NULL;
        if (!attached) {
            pn_delivery_settle(d); /* a link the router closed: drop what still arrives */
            continue;
        }
        Py_INCREF(link);
        Py_INCREF(link_id);
        Py_INCREF(tag);
        Py_INCREF(payload);
        Py_INCREF(settled);
        int pre_settled = PyObject_IsTrue(settled);
        PyObject *last = get_attr(engine, last_handle_name);
        PyObject *handle = last ? PyNumber_Add(last, one) : NULL;
        Py_XDECREF(last);
        int ok = handle && pre_settled >= 0 && set_attr(engine, last_handle_name, handle) == 0;
        if (!ok) {
            Py_DECREF(link);
            Py_DECREF(link_id);
            Py_DECREF(tag);
            Py_DECREF(payload);
            Py_DECREF(settled);
            Py_XDECREF(handle);
            return NULL;
        }
        /* From here as the Python loop's try: an error is this message's, and fails the connection. */
        PyObject *event = recycled_new((PyTypeObject *)message_type, 5);
        if (event) {
            PyTuple_SET_ITEM(event, 0, Py_NewRef(link_id));
            PyTuple_SET_ITEM(event, 1, Py_NewRef(handle));
            PyTuple_SET_ITEM(event, 2, Py_NewRef(tag));
            PyTuple_SET_ITEM(event, 3, Py_NewRef(payload));
            PyTuple_SET_ITEM(event, 4, Py_NewRef(pre_settled ? Py_True : Py_False));
        }
        int r = event ? 0 : -1;
        if (r == 0 && !pre_settled) {
            PyObject *at = PyList_GET_ITEM(items, i + 4); /* the delivery's address: how the engine keeps it */
            PyObject *pair = PyTuple_Pack(2, at, link);
            r = pair && PyDict_SetItem(incoming, at, handle) == 0 && PyDict_SetItem(handles, handle, pair) == 0 ? 0 : -1;
            Py_XDECREF(pair);
        }
        if (r == 0)
            r = dispatch_message(engine, event, link, handle_message, handlers, refused, protocol_error);
        if (r == 0 && pre_settled)
            pn_delivery_settle(d); /* pre-settled: settle our side once the core has it */
        Py_XDECREF(event);
        Py_DECREF(link);
        Py_DECREF(link_id);
        Py_DECREF(tag);
        Py_DECREF(payload);
        Py_DECREF(settled);
        Py_DECREF(handle);
        if (r < 0) {
            if (!PyErr_ExceptionMatches(PyExc_Exception))
                return NULL; /* (a KeyboardInterrupt or a SystemExit goes on up, as in Python) */
            PyObject *type, *exc, *tb;
            PyErr_Fetch(&type, &exc, &tb);
            PyErr_NormalizeException(&type, &exc, &tb);
            if (tb)
                PyException_SetTraceback(exc, tb);
            PyObject *told = PyObject_CallFunctionObjArgs(failed, conn, exc, NULL);
            Py_XDECREF(type);
            Py_XDECREF(exc);
            Py_XDECREF(tb);
            if (!told)
                return NULL;
            Py_DECREF(told);
        }
    }
    Py_RETURN_NONE;
}

/* take_flows(state, collector_address, conn, answers_first) -> int
 *
 * Engine.drain for the flow frames of subscribers' links (their credit): consumes,
 * from the head of the collector, each PN_LINK_FLOW event of a marked sender link the
 * core has (``core_attached``), as AMQP_link_flow and dispatch do: the core hears
 * CreditChanged(link_id, the link's credit, its drain flag) and its commands are
 * executed by the engine's command table; a ProtocolError goes to ``refused(event,
 * link, err)``. Stops (leaving it at the head) at the first other event, or when the
 * connection ended. Returns how many it consumed; -1, consuming nothing, when such an
 * event is at the head but ``answers_first`` is true (the loop holds answers read
 * before it: they go to the core first, then this again). ``state`` is (engine, links,
 * CreditChanged, the core's handle, command_handlers, refused, ProtocolError,
 * PN_LINK_FLOW). Any other error is raised with its event already consumed (the
 * Python loop logs it and closes the connection, as for any event). */
static PyObject *take_flows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "take_flows(state, collector_address, conn, answers_first): an 8-tuple, an int, a Conn, a bool");
        return NULL;
    }
    int answers_first = PyObject_IsTrue(args[3]);
    if (answers_first < 0)
        return NULL;
    if (!check_bound())
        return NULL;
    PyObject *state = args[0], *conn = args[2];
    PyObject *engine = PyTuple_GET_ITEM(state, 0), *links = PyTuple_GET_ITEM(state, 1);
    PyObject *credit_changed = PyTuple_GET_ITEM(state, 2), *handle = PyTuple_GET_ITEM(state, 3);
    PyObject *handlers = PyTuple_GET_ITEM(state, 4), *refused = PyTuple_GET_ITEM(state, 5);
    PyObject *protocol_error = PyTuple_GET_ITEM(state, 6);
    long flow_code = PyLong_AsLong(PyTuple_GET_ITEM(state, 7));
    void *collector = PyLong_AsVoidPtr(args[1]);
    if (PyErr_Occurred())
        return NULL;
    if (!PyDict_Check(links) || !PyDict_Check(handlers) || !collector) {
        PyErr_SetString(PyExc_TypeError, "take_flows: the engine's links and command table (dicts), a collector");
        return NULL;
    }
    Py_ssize_t taken = 0;
    for (;;) {
        void *event = pn_collector_peek(collector);
        if (!event || pn_event_type(event) != flow_code)
            break;
        void *lp = pn_event_link(event);
        if (!lp || !pn_link_is_sender(lp))
            break; /* a publisher's link: AMQP_link_flow ignores it */
        PyObject *link_id = NULL;
        PyObject *link = marked_link(lp, links, &link_id); /* borrowed; link_id new */
        if (!link) {
            if (PyErr_Occurred()) {
                pn_collector_pop(collector); /* consumed: the caller's next try is the next event */
                return NULL;
            }
            break;
        }
        PyObject *attached = get_attr(link, core_attached_name);
        int yes = attached ? PyObject_IsTrue(attached) : -1;
        Py_XDECREF(attached);
        if (yes <= 0) {
            Py_DECREF(link_id);
            if (yes < 0) {
                pn_collector_pop(collector);
                return NULL;
            }
            break;
        }
        if (answers_first) {
            Py_DECREF(link_id);
            return PyLong_FromLong(-1);
        }
        Py_INCREF(link); /* the core may forget the link (a detach): kept for refused() */
        PyObject *credit = PyLong_FromLong(pn_link_credit(lp));
        PyObject *drain = PyBool_FromLong(pn_link_get_drain(lp));
        pn_collector_pop(collector);
        taken++;
        PyObject *ev = NULL;
        if (credit) {
            PyObject *ev_args[3] = {link_id, credit, drain};
            ev = PyObject_Vectorcall(credit_changed, ev_args, 3, NULL);
        }
        int r = ev ? dispatch_message(engine, ev, link, handle, handlers, refused, protocol_error) : -1;
        Py_XDECREF(ev);
        Py_XDECREF(credit);
        Py_DECREF(drain);
        Py_DECREF(link_id);
        Py_DECREF(link);
        if (r < 0)
            return NULL;
        PyObject *dead = get_attr(conn, dead_name);
        if (!dead)
            return NULL;
        int ended = PyObject_IsTrue(dead);
        Py_DECREF(dead);
        if (ended)
            break;
    }
    return PyLong_FromSsize_t(taken);
}

/* ------------------------------------------------------------------ socket I/O */

/* What read_into and write_out return besides a count (server.py reads them). */
#define IO_NOTHING 0       /* read_into: nothing to read now, or no room; write_out: all written */
#define IO_BLOCKED 1       /* write_out: the socket took less than offered: wait until writable */
#define IO_CLOSED (-1)     /* the transport's side is done (its capacity or pending < 0) */
#define IO_EOF (-2)        /* read_into: the peer closed its side */

/* read_into's and write_out's arguments: (transport_address, fd, most); -1 with an
 * exception set when they are not a transport, a file descriptor and a size > 0. */
static int io_args(const char *name, PyObject *const *args, Py_ssize_t nargs, void **transport, int *fd,
                   Py_ssize_t *most)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s(transport_address, fd, most)", name);
        return -1;
    }
    *transport = PyLong_AsVoidPtr(args[0]);
    long n = PyLong_AsLong(args[1]);
    *most = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred() || !check_bound())
        return -1;
    if (!*transport || n < 0 || n > INT_MAX || *most <= 0) {
        PyErr_Format(PyExc_ValueError, "%s: a transport, a file descriptor and a size > 0", name);
        return -1;
    }
    *fd = (int)n;
    return 0;
}

/* read_into(transport_address, fd, most) -> int
 *
 * server.py's _read: what the socket has, at most ``most`` bytes and no more than the
 * transport can take, read straight into the transport's input buffer and processed
 * (pn_transport_push without its copy). Returns the count read (> 0), IO_NOTHING,
 * IO_CLOSED (the transport takes no more input) or IO_EOF; a socket error other than
 * "would block" raises OSError. The socket is non-blocking, so the GIL stays held: the
 * calls through cffi release and take it again each time, which cost more than the
 * system call here. */
static PyObject *read_into(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    void *transport;
    int fd;
    Py_ssize_t most;
    if (io_args("read_into", args, nargs, &transport, &fd, &most) < 0)
        return NULL;
    ssize_t capacity = pn_transport_capacity(transport);
    if (capacity < 0)
        return PyLong_FromLong(IO_CLOSED);
    if (capacity == 0)
        return PyLong_FromLong(IO_NOTHING);
    size_t want = (size_t)(capacity < most ? capacity : most);
    ssize_t n = recv(fd, pn_transport_tail(transport), want, 0);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return PyLong_FromLong(IO_NOTHING);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (n == 0)
        return PyLong_FromLong(IO_EOF);
    pn_transport_process(transport, (size_t)n); /* an error shows as the transport's error event */
    return PyLong_FromSsize_t(n);
}

/* write_out(transport_address, fd, most) -> int
 *
 * server.py's _write loop: what the transport has to send, at most ``most`` bytes a
 * send, sent from its output buffer (pn_transport_peek without its copy) and popped,
 * until it has nothing more (IO_NOTHING), the socket takes less than offered
 * (IO_BLOCKED) or the transport's side is done (IO_CLOSED). A socket error other than
 * "would block" raises OSError (what was sent before it is popped). MSG_NOSIGNAL: a
 * peer gone is an EPIPE here, never a SIGPIPE. */
static PyObject *write_out(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    void *transport;
    int fd;
    Py_ssize_t most;
    if (io_args("write_out", args, nargs, &transport, &fd, &most) < 0)
        return NULL;
    for (;;) {
        ssize_t pending = pn_transport_pending(transport);
        if (pending < 0)
            return PyLong_FromLong(IO_CLOSED);
        if (pending == 0)
            return PyLong_FromLong(IO_NOTHING);
        size_t n = (size_t)(pending < most ? pending : most);
        ssize_t sent = send(fd, pn_transport_head(transport), n, MSG_NOSIGNAL);
        if (sent < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return PyLong_FromLong(IO_BLOCKED);
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        if (sent > 0)
            pn_transport_pop(transport, (size_t)sent);
        if ((size_t)sent < n)
            return PyLong_FromLong(IO_BLOCKED);
    }
}

static PyMethodDef methods[] = {
    {"bind", bind_proton, METH_VARARGS,
     "bind(cproton_ffi_path, PN_ACCEPTED): look up proton's functions in the loaded cproton_ffi module."},
    {"set_link_id", set_link_id, METH_VARARGS,
     "set_link_id(link_address, link_id): mark a client subscriber link for the fast path (0 unmarks)."},
    {"take_accepted", (PyCFunction)(void (*)(void))take_accepted, METH_FASTCALL,
     "take_accepted(collector_address, links, seen, items) -> int: consume the run of "
     "accepted+settled dispositions at the head of the collector."},
    {"take_messages", (PyCFunction)(void (*)(void))take_messages, METH_FASTCALL,
     "take_messages(collector_address, links, items) -> int: consume the run of "
     "publishers' new whole messages at the head of the collector."},
    {"forward", (PyCFunction)(void (*)(void))forward, METH_FASTCALL,
     "forward(state, cmd): Engine.CORE_forward for a small message (see engine.py)."},
    {"encode_fields", (PyCFunction)encode_fields, METH_O,
     "encode_fields(fields): bytes as orjson.dumps(fields) gives them, or None: not encoded here (tests)."},
    {"log_line", (PyCFunction)(void (*)(void))log_line, METH_FASTCALL,
     "log_line(state, cmd): Engine.CORE_log with EventLog.append inlined (see engine.py)."},
    {"deliver_answers", (PyCFunction)(void (*)(void))deliver_answers, METH_FASTCALL,
     "deliver_answers(state, items, conn): Engine._accepted_batch with execute (see engine.py)."},
    {"deliver_messages", (PyCFunction)(void (*)(void))deliver_messages, METH_FASTCALL,
     "deliver_messages(state, items, conn): Engine._messages_batch with dispatch and execute (see engine.py)."},
    {"send_outcome", (PyCFunction)(void (*)(void))send_outcome, METH_FASTCALL,
     "send_outcome(state, cmd): Engine.CORE_send_outcome for an accepted outcome (see engine.py)."},
    {"take_flows", (PyCFunction)(void (*)(void))take_flows, METH_FASTCALL,
     "take_flows(state, collector_address, conn, answers_first) -> int: the subscribers' flow events at the head of the "
     "collector, each to the core and its commands executed (Engine.AMQP_link_flow, see engine.py)."},
    {"read_into", (PyCFunction)(void (*)(void))read_into, METH_FASTCALL,
     "read_into(transport_address, fd, most) -> int: server.py's _read (bytes read, 0, -1 closed, -2 EOF)."},
    {"write_out", (PyCFunction)(void (*)(void))write_out, METH_FASTCALL,
     "write_out(transport_address, fd, most) -> int: server.py's _write loop (0 done, 1 blocked, -1 closed)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "router.adapter._fastpath",
    "The adapter's compiled fast path for subscribers' accepted dispositions, publishers' whole "
    "messages and small copies going out (see fastpath.py).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__fastpath(void)
{
    out_name = PyUnicode_InternFromString("out");
    core_attached_name = PyUnicode_InternFromString("core_attached");
    rx_d_name = PyUnicode_InternFromString("rx_d");
    max_size_name = PyUnicode_InternFromString("max_size");
    streams_name = PyUnicode_InternFromString("streams");
    ptr_address_name = PyUnicode_InternFromString("ptr_address");
    address_name = PyUnicode_InternFromString("address");
    conn_name = PyUnicode_InternFromString("conn");
    one = PyLong_FromLong(1);
    now_name = PyUnicode_InternFromString("now");
    ts_name = PyUnicode_InternFromString("_ts");
    run_name = PyUnicode_InternFromString("_run");
    pieces_name = PyUnicode_InternFromString("_pieces");
    seq_name = PyUnicode_InternFromString("_seq");
    write_name = PyUnicode_InternFromString("_write");
    close_run_name = PyUnicode_InternFromString("_close_run");
    append_name = PyUnicode_InternFromString("append");
    piece_name = PyUnicode_InternFromString("_piece");
    dead_name = PyUnicode_InternFromString("dead");
    last_handle_name = PyUnicode_InternFromString("_last_handle");
    small_name = PyUnicode_InternFromString("_small");
    append_sub_outcomes_name = PyUnicode_InternFromString("append_sub_outcomes");
    received_kind = PyUnicode_InternFromString("received");
    completed_kind = PyUnicode_InternFromString("completed");
    fields_name = PyUnicode_InternFromString("fields");
    if (!received_kind || !completed_kind || !fields_name)
        return NULL;
    if (!append_sub_outcomes_name || !dead_name || !last_handle_name || !small_name || !one || !out_name || !core_attached_name || !rx_d_name || !max_size_name || !streams_name || !ptr_address_name
        || !address_name || !conn_name || !now_name || !ts_name || !run_name || !pieces_name || !seq_name || !write_name
        || !close_run_name || !append_name || !piece_name)
        return NULL;
    if (PyType_Ready(&LogBufferType) < 0)
        return NULL;
    PyObject *functools = PyImport_ImportModule("functools");
    PyObject *partial = functools ? PyObject_GetAttrString(functools, "partial") : NULL;
    Py_XDECREF(functools);
    if (!partial)
        return NULL;
    if (!PyType_Check(partial)) {
        Py_DECREF(partial);
        PyErr_SetString(PyExc_ImportError, "functools.partial is not a type");
        return NULL;
    }
    partial_type = (PyTypeObject *)partial; /* held for good */
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddObjectRef(m, "LogBuffer", (PyObject *)&LogBufferType) < 0)
        Py_CLEAR(m);
    return m;
}
