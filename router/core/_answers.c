/* The compiled twin of RouterCore.accepted_batch (router/core/router.py): a run of
 * subscribers' "accepted" answers, the most frequent event of exactly-once.
 *
 * router.py's accepted_batch is the specification; this only makes its usual cases
 * fast, on the same objects (one representation: the records, rosters, topics and
 * settled memory the Python core keeps, read and written through their __slots__'
 * offsets). It follows the Python loop line by line: a copy's answer while others
 * are still to answer (its byte in the compact record, the waiting count, a run of
 * sub-outcome lines), and the last answer of a delivery owed to local subscribers
 * only that every one accepted and settled: the "completed" line, the publisher's
 * outcome, the settlement, the record forgotten and remembered as settled, the
 * publisher's credit checked (settlement.py's _on_accepted_compact,
 * _outcome_to_publisher and _settle_record, inlined). Anything else it hands to
 * the same Python methods the loop calls, at the same point; where a branch of
 * those would leave the usual case (a publisher that settles second, a watcher,
 * another router, a tag reused, an at-least-once topic) the whole answer goes to
 * the Python method before anything is changed.
 *
 * tests/unit/test_answers_compiled.py plays generated histories through both and
 * requires the same commands and the same state after every step.
 *
 * Optional: without it (no C compiler at install, or EOROUTER_FASTPATH=0) the core
 * runs router.py's loop.
 */

#include "_coreobjects.h"

static Py_ssize_t rec_tag, rec_delivery_id, rec_topic, rec_order, rec_payload, rec_pub_link, rec_pub_delivery,
    rec_roster, rec_answers, rec_sent_at, rec_remote_routers, rec_outcome, rec_pub_settled, rec_reuse,
    rec_origin_router, rec_moved, rec_targeted, rec_waiting, rec_memory, rec_watchers;
static Py_ssize_t sub_key, sub_awaiting_evidence;
static Py_ssize_t ros_index, ros_all_done;
static Py_ssize_t pub_settles_first, pub_credit, pub_presettled;
static Py_ssize_t top_records, top_unsettled, top_bytes, top_publishers, top_outstanding_credit;
static Py_ssize_t mem_current, mem_previous, mem_sweep, mem_partial;

static PyTypeObject *RecordType, *SubscriptionType, *RosterType, *PublisherType, *TopicType, *MemoryType;
static PyTypeObject *SubOutcomesType, *CompletedType, *SendOutcomeType;
static PyObject *OutcomeAccepted, *AcceptedCode, *zero, *one;
static int bound;

/* ANSWER_ACCEPTED and ANSWER_DONE (records.py): an accepted copy, and one also settled. */
static unsigned char answer_accepted, answer_done;

static PyObject *s_accepted, *s_router;
static PyObject *a_subscribers, *a_records, *a_publishers, *a_topics, *a_by_delivery, *a_settled, *a_sweep_at,
    *a_draining, *a_shutdown_done, *a_pending_refills, *a_starved, *a_settings, *a_sweeps, *a_keep, *a_max_in_flight,
    *a_credit_window;
static PyObject *m_on_accepted_compact, *m_on_accepted, *m_arm_sweep, *m_release_bytes, *m_drop_topic_if_idle,
    *m_refill_credit, *m_refill_pending, *m_maybe_finish_shutdown;

/* ------------------------------------------------------------------ binding */

static const slot_def record_slots[] = {
    {"tag", &rec_tag}, {"delivery_id", &rec_delivery_id}, {"topic", &rec_topic}, {"order", &rec_order},
    {"payload", &rec_payload}, {"pub_link", &rec_pub_link}, {"pub_delivery", &rec_pub_delivery},
    {"roster", &rec_roster}, {"answers", &rec_answers}, {"sent_at", &rec_sent_at},
    {"remote_routers", &rec_remote_routers}, {"outcome", &rec_outcome}, {"pub_settled", &rec_pub_settled},
    {"reuse", &rec_reuse}, {"origin_router", &rec_origin_router}, {"moved", &rec_moved},
    {"targeted", &rec_targeted}, {"waiting", &rec_waiting}, {"memory", &rec_memory},
    {"watchers", &rec_watchers}, {NULL, NULL},
};
static const slot_def subscription_slots[] = {{"key", &sub_key}, {"awaiting_evidence", &sub_awaiting_evidence}, {NULL, NULL}};
static const slot_def roster_slots[] = {{"index", &ros_index}, {"all_done", &ros_all_done}, {NULL, NULL}};
static const slot_def publisher_slots[] = {
    {"settles_first", &pub_settles_first}, {"credit", &pub_credit}, {"presettled", &pub_presettled}, {NULL, NULL}};
static const slot_def topic_slots[] = {
    {"records", &top_records}, {"unsettled", &top_unsettled}, {"bytes", &top_bytes},
    {"publishers", &top_publishers}, {"outstanding_credit", &top_outstanding_credit}, {NULL, NULL},
};
static const slot_def memory_slots[] = {
    {"current", &mem_current}, {"previous", &mem_previous}, {"sweep", &mem_sweep}, {"partial", &mem_partial},
    {NULL, NULL},
};

static PyTypeObject *a_type(PyObject *o, int tuple_subclass) {
    if (!PyType_Check(o) || (tuple_subclass && !PyType_IsSubtype((PyTypeObject *)o, &PyTuple_Type))) {
        PyErr_SetString(PyExc_TypeError, "bind: expected a class");
        return NULL;
    }
    Py_INCREF(o);
    return (PyTypeObject *)o;
}

PyDoc_STRVAR(bind_doc,
             "bind(DeliveryRecord, Subscription, Roster, PublisherLink, Topic, StreamSettled, SubOutcomes, Completed,\n"
             "     SendOutcome, OUTCOME_ACCEPTED, ANSWER_ACCEPTED, ANSWER_DONE)\n\n"
             "The core's classes and constants, once: the slots' offsets are read from the classes\n"
             "(TypeError if one is not a plain slot any more: the core then runs in Python).");

static PyObject *bind(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "bind takes 12 arguments");
        return NULL;
    }
    PyTypeObject *types[9];
    for (int i = 0; i < 9; i++)
        if ((types[i] = a_type(args[i], i >= 6)) == NULL)
            return NULL;
    if (slot_offsets(types[0], record_slots) < 0 || slot_offsets(types[1], subscription_slots) < 0 ||
        slot_offsets(types[2], roster_slots) < 0 || slot_offsets(types[3], publisher_slots) < 0 ||
        slot_offsets(types[4], topic_slots) < 0 || slot_offsets(types[5], memory_slots) < 0)
        return NULL;
    PyObject *code = PyObject_GetAttrString(args[9], "code");
    if (code == NULL)
        return NULL;
    long accepted = PyLong_AsLong(args[10]), done = PyLong_AsLong(args[11]);
    if (PyErr_Occurred())
        return NULL;
    RecordType = types[0], SubscriptionType = types[1], RosterType = types[2], PublisherType = types[3];
    TopicType = types[4], MemoryType = types[5], SubOutcomesType = types[6], CompletedType = types[7];
    SendOutcomeType = types[8];
    Py_INCREF(args[9]);
    OutcomeAccepted = args[9];
    AcceptedCode = code;
    answer_accepted = (unsigned char)accepted;
    answer_done = (unsigned char)done;
    if (recycle_install(CompletedType, 0, 5) < 0 || recycle_install(SendOutcomeType, 0, 7) < 0 ||
        recycle_install(SubOutcomesType, 0, 4) < 0)
        return NULL;
    bound = 1;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ helpers */

/* A slot's int value, or LONG_MIN when it is not a plain int. */
static inline long int_of(PyObject *o) {
    if (o == NULL || !PyLong_CheckExact(o))
        return LONG_MIN;
    int overflow;
    long v = PyLong_AsLongAndOverflow(o, &overflow);
    return overflow ? LONG_MIN : v;
}

/* Call a core method for its effect (its result dropped). */
static int call(PyObject *core, PyObject *name, PyObject *a, PyObject *b, PyObject *c, PyObject *d, PyObject *e,
                PyObject *f) {
    PyObject *r = PyObject_CallMethodObjArgs(core, name, a, b, c, d, e, f, NULL);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* sub.awaiting_evidence and sub.awaiting_evidence[0][0] < record.sent_at: settlement
 * evidence is due to the subscriber (1), or not (0); -1 on error. */
static int evidence_due(PyObject *sub, PyObject *record) {
    PyObject *awaiting = SLOT(sub, sub_awaiting_evidence);
    int has = truth(awaiting);
    if (has <= 0)
        return has;
    PyObject *first = PySequence_GetItem(awaiting, 0);
    if (first == NULL)
        return -1;
    PyObject *sent = PySequence_GetItem(first, 0);
    Py_DECREF(first);
    if (sent == NULL)
        return -1;
    PyObject *sent_at = SLOT(record, rec_sent_at);
    if (sent_at == NULL) {
        Py_DECREF(sent);
        return 1;  /* not the usual case: Python says what it is */
    }
    int r = PyObject_RichCompareBool(sent, sent_at, Py_LT);
    Py_DECREF(sent);
    return r;
}

/* ------------------------------------------------------------------ the batch */

typedef struct {
    PyObject *core, *now, *out;
    PyObject *records, *publishers, *topics, *by_delivery;  /* new references */
    PyObject *settings;                                      /* lazily; new reference */
    long max_in_flight, credit_window;
} batch_t;

/* Whether the last answer at ``i`` completes ``record`` in the usual way, checked before
 * anything changes (settlement.py: everyone accepted and settled their copies, the
 * publisher attached and settling first, no watcher, remembered in its stream's
 * memory). 0: hand it to Python. */
static inline int same_bytes(PyObject *a, PyObject *b) {
    return a == b || (PyBytes_CheckExact(a) && PyBytes_CheckExact(b) && PyBytes_GET_SIZE(a) == PyBytes_GET_SIZE(b) &&
                      memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(a)) == 0);
}

static int completes_usually(batch_t *b, PyObject *record, PyObject *found_by, Py_ssize_t i, int settled_true) {
    if (SLOT(record, rec_pub_settled) != Py_False || truth(SLOT(record, rec_watchers)) != 0)
        return 0;
    PyObject *memory = SLOT(record, rec_memory);
    if (memory == NULL || !Py_IS_TYPE(memory, MemoryType) || int_of(SLOT(record, rec_reuse)) != 0)
        return 0;
    PyObject *pub_link = SLOT(record, rec_pub_link);
    if (pub_link == NULL)
        return 0;
    PyObject *p = PyDict_GetItemWithError(b->publishers, pub_link);
    if (p == NULL || !Py_IS_TYPE(p, PublisherType) || SLOT(p, pub_settles_first) != Py_True)
        return 0;
    /* the answers, this one given, equal the roster's all_done */
    PyObject *roster = SLOT(record, rec_roster), *answers = SLOT(record, rec_answers);
    PyObject *all_done = SLOT(roster, ros_all_done);
    if (all_done == NULL || !PyBytes_CheckExact(all_done))
        return 0;
    Py_ssize_t n = PyByteArray_GET_SIZE(answers);
    if (PyBytes_GET_SIZE(all_done) != n)
        return 0;
    const unsigned char *a = (const unsigned char *)PyByteArray_AS_STRING(answers);
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(all_done);
    for (Py_ssize_t j = 0; j < n; j++) {
        unsigned char v = j == i ? (settled_true ? answer_done : answer_accepted) : a[j];
        if (v != d[j])
            return 0;
    }
    /* records[record.tag] is the record: the caller found it under ``found_by`` (the
     * subscriber's tag), so when the two are equal bytes that is known without a lookup */
    PyObject *tag = SLOT(record, rec_tag);
    if (tag == NULL)
        return 0;
    if (!same_bytes(tag, found_by) && PyDict_GetItemWithError(b->records, tag) != record)
        return 0;
    if (SLOT(record, rec_topic) == NULL || SLOT(record, rec_order) == NULL || SLOT(record, rec_payload) == NULL)
        return 0;
    return 1;
}

/* _refill_credit(topic, out, bound_only=True): its first test, the usual answer (no
 * grant due by count), and its end when it grants nothing (grants_nothing), here;
 * anything else by the Python method. */
static int refill_bound_only(batch_t *b, PyObject *topic) {
    if (b->settings == NULL) {
        b->settings = get_attr(b->core, a_settings);
        if (b->settings == NULL)
            return -1;
        PyObject *limit = get_attr(b->settings, a_max_in_flight);
        PyObject *window = limit == NULL ? NULL : get_attr(b->settings, a_credit_window);
        b->max_in_flight = int_of(limit);
        b->credit_window = int_of(window);
        Py_XDECREF(limit);
        Py_XDECREF(window);
        if (window == NULL)
            return -1;
    }
    PyObject *draining = get_attr(b->core, a_draining);
    if (draining == NULL)
        return -1;
    int is_draining = truth(draining);
    Py_DECREF(draining);
    PyObject *publishers = SLOT(topic, top_publishers);
    long unsettled = int_of(SLOT(topic, top_unsettled)), credit = int_of(SLOT(topic, top_outstanding_credit));
    if (is_draining == 0 && publishers != NULL && PyDict_CheckExact(publishers) && PyDict_GET_SIZE(publishers) > 0 &&
        b->max_in_flight > 0 && b->credit_window != LONG_MIN && unsettled != LONG_MIN && credit != LONG_MIN) {
        long long window = b->max_in_flight / (long long)PyDict_GET_SIZE(publishers);
        if (window > b->credit_window)
            window = b->credit_window;
        if (window < 1)
            window = 1;
        long long room = (long long)b->max_in_flight - unsettled - credit;
        if (room * 8 < window)
            return 0;
        PyObject *starved = get_attr(b->core, a_starved);
        if (starved == NULL)
            return -1;
        int nothing = grants_nothing(publishers, starved, window, PublisherType, pub_credit, pub_presettled);
        Py_DECREF(starved);
        if (nothing)
            return 0;
    }
    return call(b->core, m_refill_credit, topic, b->out, Py_True, NULL, NULL, NULL);
}

/* out[at] = Completed(delivery, subscriber, settled, by, by is not None): the "completed"
 * line of a record's last answer, settled by ``by`` (None: not in this step). 0, or -1. */
static int fill_completed(PyObject *out, Py_ssize_t at, PyObject *record, PyObject *sub, PyObject *settled, PyObject *by) {
    PyObject *items[5] = {SLOT(record, rec_delivery_id), SLOT(sub, sub_key), settled, by, by == Py_None ? Py_False : Py_True};
    PyObject *line = command(CompletedType, 5, items);
    return line == NULL ? -1 : PyList_SetItem(out, at, line); /* (steals the line) */
}

/* The last answer of a compact record that completes_usually(): _on_accepted_compact's
 * last answer, _outcome_to_publisher and _settle_record, in their order. */
static int complete(batch_t *b, PyObject *sub, PyObject *record, Py_ssize_t i, PyObject *settled, int settled_true) {
    PyObject *answers = SLOT(record, rec_answers);
    ((unsigned char *)PyByteArray_AS_STRING(answers))[i] = settled_true ? answer_done : answer_accepted;
    set_slot(record, rec_waiting, zero);
    set_slot(record, rec_outcome, OutcomeAccepted);
    /* its "completed" line's place, filled once the settlement below is done (always the
     * router's, deleting the record: completes_usually() checked what _settle_record does),
     * or without it when something fails on the way (as _complete's ``finally`` does) */
    Py_ssize_t logged = PyList_GET_SIZE(b->out);
    int filled = 0;
    if (PyList_Append(b->out, Py_None) < 0)
        return -1;
    /* _outcome_to_publisher: accepted, and settled (its publisher settles first) */
    PyObject *outcome_items[7] = {SLOT(record, rec_pub_delivery), AcceptedCode, Py_True, Py_None, Py_None, Py_False, Py_False};
    if (append_new(b->out, command(SendOutcomeType, 7, outcome_items)) < 0)
        goto error;
    /* _settle_record(record, "router", now, out, fold) */
    set_slot(record, rec_pub_settled, Py_True);
    PyObject *sweep_at = get_attr(b->core, a_sweep_at);
    if (sweep_at == NULL)
        goto error;
    Py_DECREF(sweep_at);
    /* (Python code run on the way may change the core's maps: then records[tag] is asked again below) */
    int ran_python = sweep_at == Py_None;
    if (ran_python && call(b->core, m_arm_sweep, b->now, NULL, NULL, NULL, NULL, NULL) < 0)
        goto error;
    PyObject *payload = SLOT(record, rec_payload);
    Py_INCREF(payload);
    set_slot(record, rec_payload, Py_None);
    PyObject *pub_delivery = SLOT(record, rec_pub_delivery);
    if (pub_delivery != Py_None) {
        PyObject *present = dict_pop(b->by_delivery, pub_delivery);
        if (present == NULL && PyErr_Occurred()) {
            Py_DECREF(payload);
            goto error;
        }
        Py_XDECREF(present);
        set_slot(record, rec_pub_delivery, Py_None);
    }
    PyObject *topic = PyDict_GetItemWithError(b->topics, SLOT(record, rec_topic));
    if (topic == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, SLOT(record, rec_topic));
        Py_DECREF(payload);
        goto error;
    }
    Py_INCREF(topic);
    int ok = 0;
    if (!Py_IS_TYPE(topic, TopicType)) {
        PyErr_SetString(PyExc_TypeError, "a topic of another class");
        goto done;
    }
    /* (origin_router is None: this router's own publisher sent it) */
    PyObject *unsettled = PyNumber_Subtract(SLOT(topic, top_unsettled), one);
    if (unsettled == NULL)
        goto done;
    set_slot(topic, top_unsettled, unsettled);
    Py_DECREF(unsettled);
    /* every subscriber settled its copy itself, nothing to relay: everyone knows */
    int has_bytes = truth(SLOT(topic, top_bytes));
    if (has_bytes < 0)
        goto done;
    if (has_bytes && payload != Py_None) {
        ran_python = 1;
        if (call(b->core, m_release_bytes, topic, payload, NULL, NULL, NULL, NULL) < 0)
            goto done;
    }
    /* the record forgotten and remembered as settled (self._delete, inlined there too):
     * records[tag] is the record (completes_usually) unless Python code ran since */
    PyObject *tag = SLOT(record, rec_tag);
    PyObject *held = ran_python ? PyDict_GetItemWithError(b->records, tag) : record;
    if (held == NULL && PyErr_Occurred())
        goto done;
    if (held == record) {
        PyObject *popped = dict_pop(b->records, tag);
        Py_XDECREF(popped); /* (the record: the caller holds it too) */
        if (popped == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, tag);
            goto done;
        }
        PyObject *by_order = SLOT(topic, top_records);
        if (PyObject_DelItem(by_order, SLOT(record, rec_order)) < 0)
            goto done;
        PyObject *settled_memory = get_attr(b->core, a_settled);
        if (settled_memory == NULL)
            goto done;
        PyObject *sweeps = get_attr(settled_memory, a_sweeps);
        PyObject *keep = sweeps == NULL ? NULL : get_attr(settled_memory, a_keep);
        Py_DECREF(settled_memory);
        if (keep == NULL) {
            Py_XDECREF(sweeps);
            goto done;
        }
        PyObject *memory = SLOT(record, rec_memory);
        set_slot(memory, mem_sweep, sweeps);
        Py_DECREF(sweeps);
        PyObject *current = SLOT(memory, mem_current);
        Py_INCREF(current);
        int stored = PyObject_SetItem(current, tag, AcceptedCode);
        Py_ssize_t size = stored < 0 ? -1 : PyObject_Length(current);
        long limit = int_of(keep);
        Py_DECREF(keep);
        int full = size < 0 ? -1 : limit == LONG_MIN ? (PyErr_SetString(PyExc_TypeError, "settled.keep is not an int"), -1)
                                                     : size >= limit;
        if (full > 0) {
            PyObject *fresh = PyDict_New();
            if (fresh == NULL) {
                full = -1;
            } else {
                set_slot(memory, mem_previous, current);
                set_slot(memory, mem_current, fresh);
                set_slot(memory, mem_partial, Py_False);
                Py_DECREF(fresh);
            }
        }
        Py_DECREF(current);
        if (full < 0)
            goto done;
        int left = truth(SLOT(topic, top_records));
        if (left < 0 || (left == 0 && call(b->core, m_drop_topic_if_idle, topic, NULL, NULL, NULL, NULL, NULL) < 0))
            goto done;
    }
    if (fill_completed(b->out, logged, record, sub, settled, s_router) < 0)
        goto done;
    filled = 1;
    if (refill_bound_only(b, topic) < 0)
        goto done;
    ok = 1;
done:
    Py_DECREF(topic);
    Py_DECREF(payload);
    if (ok)
        return 0;
error:
    if (!filled) { /* its line all the same, not settled by this step (the error stays the one raised) */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        if (fill_completed(b->out, logged, record, sub, settled, Py_None) < 0)
            PyErr_Clear();
        PyErr_Restore(type, value, traceback);
    }
    return -1;
}

PyDoc_STRVAR(accepted_batch_doc,
             "accepted_batch(core, items, now, out)\n\n"
             "RouterCore.accepted_batch(items, now, out) for ``core``: the same commands in ``out``,\n"
             "the same state after (router/core/_answers.c says which cases it takes itself).");

static PyObject *accepted_batch(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_CheckExact(args[1]) || !PyList_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "accepted_batch(core, items: list, now, out: list)");
        return NULL;
    }
    if (!bound) {
        PyErr_SetString(PyExc_RuntimeError, "accepted_batch: bind() first");
        return NULL;
    }
    batch_t b = {args[0], args[2], args[3], NULL, NULL, NULL, NULL, NULL, 0, 0};
    PyObject *items = args[1];
    PyObject *subscribers = get_attr(b.core, a_subscribers);
    PyObject *result = NULL;
    PyObject *sub = NULL, *last_link = NULL;  /* new references */
    PyObject *run = NULL;                     /* borrowed: the SubOutcomes at the end of out */
    if (subscribers == NULL || (b.records = get_attr(b.core, a_records)) == NULL ||
        (b.publishers = get_attr(b.core, a_publishers)) == NULL ||
        (b.topics = get_attr(b.core, a_topics)) == NULL ||
        (b.by_delivery = get_attr(b.core, a_by_delivery)) == NULL)
        goto finish;
    if (!PyDict_CheckExact(subscribers) || !PyDict_CheckExact(b.records) || !PyDict_CheckExact(b.publishers) ||
        !PyDict_CheckExact(b.topics) || !PyDict_CheckExact(b.by_delivery)) {
        PyErr_SetString(PyExc_TypeError, "accepted_batch: the core's maps are not dicts");
        goto finish;
    }
    Py_ssize_t n = PyList_GET_SIZE(items);
    for (Py_ssize_t j = 0; j + 2 < n; j += 3) {
        PyObject *link_id = PyList_GET_ITEM(items, j), *tag = PyList_GET_ITEM(items, j + 1);
        PyObject *settled = PyList_GET_ITEM(items, j + 2);
        if (last_link == NULL || link_id != last_link) {
            int same = last_link == NULL ? 0 : PyObject_RichCompareBool(link_id, last_link, Py_EQ);
            if (same < 0)
                goto finish;
            if (!same) {
                PyObject *found = PyDict_GetItemWithError(subscribers, link_id);
                if (found == NULL && PyErr_Occurred())
                    goto finish;
                Py_XINCREF(found);
                Py_XSETREF(sub, found);
                Py_INCREF(link_id);
                Py_XSETREF(last_link, link_id);
            }
        }
        if (sub == NULL || sub == Py_None)
            continue;
        PyObject *record = PyDict_GetItemWithError(b.records, tag);
        if (record == NULL) {
            if (PyErr_Occurred())
                goto finish;
            continue;
        }
        if (!Py_IS_TYPE(record, RecordType) || !Py_IS_TYPE(sub, SubscriptionType)) {
            PyErr_SetString(PyExc_TypeError, "accepted_batch: a record or subscription of another class");
            goto finish;
        }
        Py_INCREF(record);
        int failed = 0;
        PyObject *key = SLOT(sub, sub_key);
        PyObject *answers = SLOT(record, rec_answers);
        if (key == NULL || answers == NULL) {
            PyErr_SetString(PyExc_AttributeError, "accepted_batch: an unset slot");
            failed = 1;
        } else if (answers == Py_None) {
            /* Expanded (records.py): an unusual record, the general path. */
            PyObject *states = get_attr(record, a_subscribers);
            PyObject *state = states == NULL ? NULL : PyObject_CallMethod(states, "get", "O", key);
            Py_XDECREF(states);
            if (state == NULL) {
                failed = 1;
            } else {
                if (state != Py_None) {
                    failed = call(b.core, m_on_accepted, sub, record, state, settled, b.now, b.out) < 0;
                    run = NULL;  /* what it appended comes after the run */
                }
                Py_DECREF(state);
            }
        } else {
            /* Compact (answers set): so is its roster. */
            PyObject *roster = SLOT(record, rec_roster);
            PyObject *index = roster == NULL || !Py_IS_TYPE(roster, RosterType) ? NULL : SLOT(roster, ros_index);
            PyObject *at = index == NULL ? NULL : PyDict_GetItemWithError(index, key);
            if (index == NULL || !PyDict_CheckExact(index) || !PyByteArray_CheckExact(answers)) {
                PyErr_SetString(PyExc_TypeError, "accepted_batch: a compact record not as records.py makes it");
                failed = 1;
            } else if (at == NULL) {
                failed = PyErr_Occurred() != NULL;
            } else {
                Py_ssize_t i = PyLong_AsSsize_t(at);
                int settled_true = PyObject_IsTrue(settled);
                if ((i == -1 && PyErr_Occurred()) || settled_true < 0) {
                    failed = 1;
                } else if (i < 0 || i >= PyByteArray_GET_SIZE(answers)) {
                    PyErr_SetString(PyExc_IndexError, "accepted_batch: a roster index past the answers");
                    failed = 1;
                } else {
                    unsigned char *bytes = (unsigned char *)PyByteArray_AS_STRING(answers);
                    long waiting = int_of(SLOT(record, rec_waiting));
                    int usual = !bytes[i] && waiting >= 1 && waiting != LONG_MIN &&
                                truth(SLOT(record, rec_targeted)) == 0 && SLOT(record, rec_outcome) == Py_None &&
                                truth(SLOT(record, rec_remote_routers)) == 0 && truth(SLOT(record, rec_moved)) == 0 &&
                                SLOT(record, rec_origin_router) == Py_None && SLOT(record, rec_pub_delivery) != NULL &&
                                SLOT(record, rec_pub_delivery) != Py_None;
                    if (usual) {
                        int due = evidence_due(sub, record);
                        if (due < 0)
                            failed = 1;
                        usual = due == 0;
                    }
                    if (failed) {
                    } else if (usual && waiting > 1) {
                        /* the first answer of this subscriber, others still to answer: only its line */
                        bytes[i] = settled_true ? answer_done : answer_accepted;
                        PyObject *left = PyLong_FromLong(waiting - 1);
                        if (left == NULL) {
                            failed = 1;
                        } else {
                            set_slot(record, rec_waiting, left);
                            Py_DECREF(left);
                            PyObject *delivery = SLOT(record, rec_delivery_id);
                            int same = 0;
                            if (run != NULL && PyTuple_GET_ITEM(run, 3) == settled) {
                                same = PyObject_RichCompareBool(PyTuple_GET_ITEM(run, 1), key, Py_EQ);
                                if (same < 0)
                                    failed = 1;
                            }
                            if (failed) {
                            } else if (same) {
                                failed = PyList_Append(PyTuple_GET_ITEM(run, 0), delivery) < 0;
                            } else {
                                PyObject *deliveries = PyList_New(1);
                                if (deliveries == NULL) {
                                    failed = 1;
                                } else {
                                    Py_INCREF(delivery);
                                    PyList_SET_ITEM(deliveries, 0, delivery);
                                    PyObject *run_items[4] = {deliveries, key, s_accepted, settled};
                                    PyObject *made = command(SubOutcomesType, 4, run_items);
                                    Py_DECREF(deliveries);
                                    failed = append_new(b.out, made) < 0;
                                    run = failed ? NULL : made;  /* out holds it */
                                }
                            }
                        }
                    } else {
                        int done_here = usual && waiting == 1;
                        if (done_here) {
                            done_here = completes_usually(&b, record, tag, i, settled_true);
                            if (PyErr_Occurred())
                                failed = 1;
                        }
                        if (failed) {
                        } else if (done_here) {
                            failed = complete(&b, sub, record, i, settled, settled_true) < 0;
                        } else {
                            PyObject *at_i = PyLong_FromSsize_t(i);
                            failed = at_i == NULL ||
                                     call(b.core, m_on_accepted_compact, sub, record, at_i, settled, b.now, b.out) < 0;
                            Py_XDECREF(at_i);
                        }
                        run = NULL;
                    }
                }
            }
        }
        Py_DECREF(record);
        if (failed)
            goto finish;
    }
    {
        PyObject *pending = get_attr(b.core, a_pending_refills);
        int has = pending == NULL ? -1 : truth(pending);
        Py_XDECREF(pending);
        if (has < 0 || (has && call(b.core, m_refill_pending, b.out, NULL, NULL, NULL, NULL, NULL) < 0))
            goto finish;
        PyObject *draining = get_attr(b.core, a_draining);
        int is_draining = draining == NULL ? -1 : truth(draining);
        Py_XDECREF(draining);
        if (is_draining < 0)
            goto finish;
        if (is_draining) {
            PyObject *finished = get_attr(b.core, a_shutdown_done);
            int done = finished == NULL ? -1 : truth(finished);
            Py_XDECREF(finished);
            if (done < 0 || (!done && call(b.core, m_maybe_finish_shutdown, b.now, b.out, NULL, NULL, NULL, NULL) < 0))
                goto finish;
        }
    }
    result = Py_None;
    Py_INCREF(result);
finish:
    Py_XDECREF(sub);
    Py_XDECREF(last_link);
    Py_XDECREF(subscribers);
    Py_XDECREF(b.records);
    Py_XDECREF(b.publishers);
    Py_XDECREF(b.topics);
    Py_XDECREF(b.by_delivery);
    Py_XDECREF(b.settings);
    return result;
}

/* ------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL, bind_doc},
    {"accepted_batch", (PyCFunction)(void (*)(void))accepted_batch, METH_FASTCALL, accepted_batch_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "router.core._answers",
    "The compiled twin of RouterCore.accepted_batch (router/core/_answers.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__answers(void) {
    if ((zero = PyLong_FromLong(0)) == NULL || (one = PyLong_FromLong(1)) == NULL)
        return NULL;
    INTERN(s_accepted, "accepted");
    INTERN(s_router, "router");
    INTERN(a_subscribers, "subscribers");
    INTERN(a_records, "records");
    INTERN(a_publishers, "publishers");
    INTERN(a_topics, "topics");
    INTERN(a_by_delivery, "by_delivery");
    INTERN(a_settled, "settled");
    INTERN(a_sweep_at, "_sweep_at");
    INTERN(a_draining, "draining");
    INTERN(a_shutdown_done, "_shutdown_done");
    INTERN(a_pending_refills, "_pending_refills");
    INTERN(a_starved, "_starved");
    INTERN(a_settings, "settings");
    INTERN(a_sweeps, "sweeps");
    INTERN(a_keep, "keep");
    INTERN(a_max_in_flight, "max_in_flight_per_topic");
    INTERN(a_credit_window, "publisher_credit_window");
    INTERN(m_on_accepted_compact, "_on_accepted_compact");
    INTERN(m_on_accepted, "_on_accepted");
    INTERN(m_arm_sweep, "_arm_sweep");
    INTERN(m_release_bytes, "_release_bytes");
    INTERN(m_drop_topic_if_idle, "_drop_topic_if_idle");
    INTERN(m_refill_credit, "_refill_credit");
    INTERN(m_refill_pending, "_refill_pending");
    INTERN(m_maybe_finish_shutdown, "_maybe_finish_shutdown");
    return PyModule_Create(&module);
}
