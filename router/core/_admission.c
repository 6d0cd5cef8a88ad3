/* The compiled twin of the core's handling of a publisher's message (admission.py:
 * _on_message, _name_delivery, _new_record, _fan_out and _distribute), for the usual
 * case: a new delivery of an exactly-once topic whose subscribers are all here, owed
 * to all of them (no selector, no best-effort subscriber, no placeholder), no other
 * router interested, no failover in progress (no resend expected from the publisher,
 * no router lost), the tag short and never used in the stream's settled memory.
 *
 * admission.py is the specification; this works on the core's own objects (the
 * publisher link, the topic, its roster and subscriptions, the records, the settled
 * memory: through their __slots__' offsets) and makes the record with the core's own
 * DeliveryRecord class. What is not the usual case is known before anything changes,
 * and the message then goes to admission.py's _on_message whole. Preparing the
 * message (the origin annotation spliced in, its expiry: message.py) is done here for
 * the usual shape (sections.py's fast path: a binary body and no header or properties
 * to read) and by the Python method otherwise, as are a timer for a message that
 * expires and a credit grant when one may be due.
 *
 * tests/unit/test_core_compiled.py plays generated histories through a core with its
 * compiled twins and one without, and requires the same commands and the same state.
 *
 * Optional: without it (no C compiler at install, or EOROUTER_FASTPATH=0) the core
 * runs admission.py.
 */

#include "_coreobjects.h"

#include <stdint.h>
#include <string.h>

static Py_ssize_t pub_link_id, pub_container_id, pub_name, pub_topic, pub_incarnation, pub_stream, pub_presettled,
    pub_credit, pub_next_seq, pub_resending, pub_memory, pub_origin;
static Py_ssize_t top_name, top_subscriptions, top_records, top_unsettled, top_outstanding_credit, top_roster,
    top_bytes, top_est, top_largest_recent, top_published, top_guarantee;
static Py_ssize_t ros_subs, ros_keys, ros_selective;
static Py_ssize_t sub_link_id, sub_credit, sub_ready, sub_queue, sub_placeholders;
static Py_ssize_t mem_current, mem_previous;
static Py_ssize_t tpl_tail, tpl_section_heads;
static Py_ssize_t rec_roster, rec_answers, rec_sent_at, rec_waiting, rec_memory, rec_arrived, rec_delivery_id,
    rec_order;

static PyTypeObject *PublisherType, *TopicType, *RosterType, *SubscriptionType, *MemoryType, *RecordType;
static PyTypeObject *ForwardType, *ReceivedType, *TemplateType;
/* sections.py's _EMPTY_HEADER, _EMPTY_PROPERTIES and _DATA: the shape of the usual message */
static char empty_header[4], empty_properties[4], data_descriptor[3];
static PyObject *exactly_once, *timer_expiry, *zero;
static long max_inline_tag, uncounted_below;
static unsigned char answer_unsent;
static int bound;

static PyObject *a_publishers, *a_topics, *a_draining, *a_stream_seq, *a_records, *a_by_delivery, *a_net, *a_interest,
    *a_lost, *a_order, *a_send_counter, *a_promised, *a_bytes_held, *a_settings, *a_credit_window, *a_max_in_flight, *a_starved,
    *a_pending_refills, *a_shutdown_done;
static PyObject *m_on_message, *m_prepare_payload, *m_add_timer, *m_refill_credit, *m_refill_pending,
    *m_maybe_finish_shutdown;

/* ------------------------------------------------------------------ binding */

static const slot_def publisher_slots[] = {
    {"link_id", &pub_link_id}, {"container_id", &pub_container_id}, {"name", &pub_name}, {"topic", &pub_topic},
    {"incarnation", &pub_incarnation}, {"stream", &pub_stream}, {"presettled", &pub_presettled},
    {"credit", &pub_credit}, {"next_seq", &pub_next_seq}, {"resending", &pub_resending}, {"memory", &pub_memory},
    {"origin", &pub_origin}, {NULL, NULL},
};
static const slot_def topic_slots[] = {
    {"name", &top_name}, {"subscriptions", &top_subscriptions}, {"records", &top_records},
    {"unsettled", &top_unsettled}, {"outstanding_credit", &top_outstanding_credit}, {"roster", &top_roster},
    {"bytes", &top_bytes}, {"est", &top_est}, {"largest_recent", &top_largest_recent},
    {"published", &top_published}, {"guarantee", &top_guarantee}, {NULL, NULL},
};
static const slot_def roster_slots[] = {{"subs", &ros_subs}, {"keys", &ros_keys}, {"selective", &ros_selective}, {NULL, NULL}};
static const slot_def subscription_slots[] = {
    {"link_id", &sub_link_id}, {"credit", &sub_credit}, {"ready", &sub_ready}, {"queue", &sub_queue},
    {"placeholders", &sub_placeholders}, {NULL, NULL},
};
static const slot_def memory_slots[] = {{"current", &mem_current}, {"previous", &mem_previous}, {NULL, NULL}};
static const slot_def template_slots[] = {{"tail", &tpl_tail}, {"_section_heads", &tpl_section_heads}, {NULL, NULL}};
static const slot_def record_slots[] = {
    {"roster", &rec_roster}, {"answers", &rec_answers}, {"sent_at", &rec_sent_at}, {"waiting", &rec_waiting},
    {"memory", &rec_memory}, {"arrived", &rec_arrived}, {"delivery_id", &rec_delivery_id}, {"order", &rec_order},
    {NULL, NULL},
};

static int learn_record(void);

PyDoc_STRVAR(bind_doc,
             "bind(PublisherLink, Topic, Roster, Subscription, StreamSettled, DeliveryRecord, Forward, Log,\n"
             "     EXACTLY_ONCE, ANSWER_UNSENT, MAX_INLINE_TAG, UNCOUNTED_BELOW, _TIMER_EXPIRY,\n"
             "     OriginTemplate, _EMPTY_HEADER, _EMPTY_PROPERTIES, _DATA)\n\n"
             "The core's classes and constants, once (TypeError if a field is not a plain slot any more:\n"
             "the core then runs admission.py).");

static PyObject *bind(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 17) {
        PyErr_SetString(PyExc_TypeError, "bind takes 17 arguments");
        return NULL;
    }
    if (!PyType_Check(args[13]) || slot_offsets((PyTypeObject *)args[13], template_slots) < 0)
        return PyErr_Occurred() ? NULL : (PyErr_SetString(PyExc_TypeError, "bind: OriginTemplate"), NULL);
    if (!PyBytes_Check(args[14]) || PyBytes_GET_SIZE(args[14]) != 4 || !PyBytes_Check(args[15]) ||
        PyBytes_GET_SIZE(args[15]) != 4 || !PyBytes_Check(args[16]) || PyBytes_GET_SIZE(args[16]) != 3) {
        PyErr_SetString(PyExc_TypeError, "bind: the sections' prefixes are 4, 4 and 3 bytes");
        return NULL;
    }
    memcpy(empty_header, PyBytes_AS_STRING(args[14]), 4);
    memcpy(empty_properties, PyBytes_AS_STRING(args[15]), 4);
    memcpy(data_descriptor, PyBytes_AS_STRING(args[16]), 3);
    Py_INCREF(args[13]);
    TemplateType = (PyTypeObject *)args[13];
    for (int i = 0; i < 8; i++)
        if (!PyType_Check(args[i])) {
            PyErr_SetString(PyExc_TypeError, "bind: expected a class");
            return NULL;
        }
    if (slot_offsets((PyTypeObject *)args[0], publisher_slots) < 0 ||
        slot_offsets((PyTypeObject *)args[1], topic_slots) < 0 || slot_offsets((PyTypeObject *)args[2], roster_slots) < 0 ||
        slot_offsets((PyTypeObject *)args[3], subscription_slots) < 0 ||
        slot_offsets((PyTypeObject *)args[4], memory_slots) < 0 || slot_offsets((PyTypeObject *)args[5], record_slots) < 0)
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)args[6], &PyTuple_Type) || !PyType_IsSubtype((PyTypeObject *)args[7], &PyTuple_Type) ||
        !PyUnicode_Check(args[8])) {
        PyErr_SetString(PyExc_TypeError, "bind: Forward and Received are tuples, EXACTLY_ONCE a str");
        return NULL;
    }
    long unsent = PyLong_AsLong(args[9]), inline_tag = PyLong_AsLong(args[10]), uncounted = PyLong_AsLong(args[11]);
    if (PyErr_Occurred())
        return NULL;
    PyTypeObject **types[8] = {&PublisherType, &TopicType, &RosterType, &SubscriptionType,
                               &MemoryType, &RecordType, &ForwardType, &ReceivedType};
    for (int i = 0; i < 8; i++) {
        Py_INCREF(args[i]);
        *types[i] = (PyTypeObject *)args[i];
    }
    Py_INCREF(args[8]);
    exactly_once = args[8];
    Py_INCREF(args[12]);
    timer_expiry = args[12];
    answer_unsent = (unsigned char)unsent;
    max_inline_tag = inline_tag;
    uncounted_below = uncounted;
    if (learn_record() < 0 || recycle_install(ForwardType, 0, 4) < 0 || recycle_install(ReceivedType, 0, 11) < 0 ||
        recycle_install(RecordType, 1, 0) < 0)
        return NULL;
    bound = 1;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ helpers */

/* A slot set to a new int (value stolen); -1 when it could not be made. */
static inline int set_int(PyObject *o, Py_ssize_t offset, long long value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL)
        return -1;
    set_slot(o, offset, v);
    Py_DECREF(v);
    return 0;
}

/* A slot's plain int value in *v; 0 when it is not one (not the usual case). */
static inline int int_of(PyObject *o, long long *v) {
    if (o == NULL || !PyLong_CheckExact(o))
        return 0;
    int overflow;
    *v = PyLong_AsLongLongAndOverflow(o, &overflow);
    return !overflow && !(*v == -1 && PyErr_Occurred());
}

static int attr_int(PyObject *o, PyObject *name, long long *v) {
    PyObject *value = get_attr(o, name);
    if (value == NULL)
        return -1;
    int ok = int_of(value, v);
    Py_DECREF(value);
    if (!ok) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "%U is not an int", name);
        return -1;
    }
    return 0;
}

static int set_attr_int(PyObject *o, PyObject *name, long long v) {
    PyObject *value = PyLong_FromLongLong(v);
    if (value == NULL)
        return -1;
    int r = set_attr(o, name, value);
    Py_DECREF(value);
    return r;
}

static PyObject *hex_of(PyObject *bytes) {
    static const char digits[] = "0123456789abcdef";
    Py_ssize_t n = PyBytes_GET_SIZE(bytes);
    PyObject *text = PyUnicode_New(2 * n, 127);
    if (text == NULL)
        return NULL;
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(bytes);
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(text);
    for (Py_ssize_t i = 0; i < n; i++) {
        out[2 * i] = (Py_UCS1)digits[b[i] >> 4];
        out[2 * i + 1] = (Py_UCS1)digits[b[i] & 15];
    }
    return text;
}

/* ------------------------------------------------------------------ the record */

/* DeliveryRecord.__init__'s arguments, in order, and the slot each is kept in. */
static const char *const record_arg_names[13] = {
    "tag",      "topic",      "order",      "payload",     "publisher",    "link_name", "pub_tag",
    "incarnation", "stream_seq", "pub_link", "pub_delivery", "expires_at", "reuse",
};
static Py_ssize_t record_arg_offsets[13];
/* The other slots __init__ sets, and the value it sets each to (learnt at bind). */
#define RECORD_DEFAULTS_MAX 64
static Py_ssize_t record_default_offsets[RECORD_DEFAULTS_MAX];
static PyObject *record_defaults[RECORD_DEFAULTS_MAX];
static int record_default_count;

/* A value a record can share with every other: __init__'s constants (None, a number, a
 * text, the empty map and set) are; a new list or dict per record would not be. */
static int shareable(PyObject *v) {
    return v == Py_None || PyBool_Check(v) || PyLong_CheckExact(v) || PyFloat_CheckExact(v) ||
           PyUnicode_CheckExact(v) || PyBytes_CheckExact(v) || PyFrozenSet_CheckExact(v) ||
           (PyTuple_CheckExact(v) && PyTuple_GET_SIZE(v) == 0) || Py_IS_TYPE(v, &PyDictProxy_Type);
}

/* Learn what DeliveryRecord.__init__ does, by making one: each argument kept as it is
 * in its slot, delivery_id the tag in hex, every other slot it sets a constant that
 * records may share. new_record() then does the same without the call. Anything else
 * (a slot computed otherwise, a new mutable value per record, an argument renamed) is
 * a TypeError: bind() fails and the core runs admission.py. */
static int learn_record(void) {
    slot_def defs[14];
    for (int i = 0; i < 13; i++)
        defs[i] = (slot_def){record_arg_names[i], &record_arg_offsets[i]};
    defs[13] = (slot_def){NULL, NULL};
    if (slot_offsets(RecordType, defs) < 0)
        return -1;
    PyObject *args[13] = {NULL};
    args[0] = PyBytes_FromString("learn");
    for (int i = 1; i < 12; i++)
        args[i] = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type); /* a value nothing else is */
    args[12] = PyLong_FromLong(0);
    PyObject *record = NULL, *hex = NULL;
    int ok = 0;
    for (int i = 0; i < 13; i++)
        if (args[i] == NULL)
            goto done;
    record = PyObject_Vectorcall((PyObject *)RecordType, args, 13, NULL);
    hex = record == NULL ? NULL : PyObject_CallMethod(args[0], "hex", NULL);
    if (hex == NULL)
        goto done;
    if (!Py_IS_TYPE(record, RecordType)) {
        PyErr_SetString(PyExc_TypeError, "bind: DeliveryRecord made something else");
        goto done;
    }
    for (int i = 0; i < 13; i++)
        if (SLOT(record, record_arg_offsets[i]) != args[i]) {
            PyErr_Format(PyExc_TypeError, "bind: DeliveryRecord.__init__ does not keep %s as given", record_arg_names[i]);
            goto done;
        }
    PyObject *id = SLOT(record, rec_delivery_id);
    if (id == NULL || !PyUnicode_CheckExact(id) || PyUnicode_Compare(id, hex) != 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "bind: DeliveryRecord's delivery_id is not its tag in hex");
        goto done;
    }
    record_default_count = 0;
    Py_ssize_t pos = 0;
    PyObject *name, *descr;
    while (PyDict_Next(RecordType->tp_dict, &pos, &name, &descr)) {
        if (!Py_IS_TYPE(descr, &PyMemberDescr_Type) || ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX)
            continue;
        Py_ssize_t offset = ((PyMemberDescrObject *)descr)->d_member->offset;
        int is_arg = offset == rec_delivery_id;
        for (int i = 0; i < 13; i++)
            is_arg |= offset == record_arg_offsets[i];
        PyObject *value = SLOT(record, offset);
        if (is_arg || value == NULL) /* (NULL: a slot set only when it applies) */
            continue;
        if (!shareable(value) || record_default_count == RECORD_DEFAULTS_MAX) {
            PyErr_Format(PyExc_TypeError, "bind: DeliveryRecord.__init__ sets %S to a %s", name, Py_TYPE(value)->tp_name);
            goto done;
        }
        record_default_offsets[record_default_count] = offset;
        record_defaults[record_default_count++] = Py_NewRef(value);
    }
    ok = 1;
done:
    for (int i = 0; i < 13; i++)
        Py_XDECREF(args[i]);
    Py_XDECREF(record);
    Py_XDECREF(hex);
    return ok ? 0 : -1;
}

/* DeliveryRecord(*args) for a tag used once (reuse 0), without the call: what
 * learn_record() saw __init__ do. */
static PyObject *new_record(PyObject *const *args) {
    PyObject *id = hex_of(args[0]);
    if (id == NULL)
        return NULL;
    PyObject *record = recycled_new(RecordType, 0);
    if (record == NULL) {
        Py_DECREF(id);
        return NULL;
    }
    for (int i = 0; i < 13; i++)
        SLOT(record, record_arg_offsets[i]) = Py_NewRef(args[i]);
    SLOT(record, rec_delivery_id) = id;
    for (int i = 0; i < record_default_count; i++)
        SLOT(record, record_default_offsets[i]) = Py_NewRef(record_defaults[i]);
    return record;
}

/* ------------------------------------------------------------------ the message */

/* What the usual case needs, read (borrowed) before anything changes. */
typedef struct {
    PyObject *core, *ev, *now, *out;
    PyObject *pub, *topic, *roster, *memory, *tag; /* tag: a new reference */
    PyObject *records, *by_delivery;               /* new references */
} message_t;

/* 1: the usual case (m filled); 0: not (admission.py takes it whole); -1: error. */
static int usual(message_t *m) {
    PyObject *ev = m->ev;
    if (!PyTuple_Check(ev) || PyTuple_GET_SIZE(ev) < 5)
        return 0;
    PyObject *ptag = PyTuple_GET_ITEM(ev, 2), *payload = PyTuple_GET_ITEM(ev, 3);
    if (PyTuple_GET_ITEM(ev, 4) != Py_False || !PyBytes_CheckExact(ptag) || !PyBytes_CheckExact(payload) ||
        PyBytes_GET_SIZE(ptag) > max_inline_tag)
        return 0;
    PyObject *publishers = get_attr(m->core, a_publishers);
    if (publishers == NULL)
        return -1;
    PyObject *pub = PyDict_CheckExact(publishers) ? PyDict_GetItemWithError(publishers, PyTuple_GET_ITEM(ev, 0)) : NULL;
    Py_DECREF(publishers); /* the core holds it, and so the link */
    if (pub == NULL)
        return PyErr_Occurred() ? -1 : 0; /* unknown link: admission.py says so */
    if (!Py_IS_TYPE(pub, PublisherType) || SLOT(pub, pub_presettled) != Py_False || SLOT(pub, pub_resending) != Py_None)
        return 0;
    PyObject *draining = get_attr(m->core, a_draining);
    int is_draining = truth(draining);
    Py_XDECREF(draining);
    if (is_draining != 0)
        return is_draining < 0 && PyErr_Occurred() ? -1 : 0;
    PyObject *topics = get_attr(m->core, a_topics);
    if (topics == NULL)
        return -1;
    PyObject *topic = PyDict_CheckExact(topics) && SLOT(pub, pub_topic) != NULL
                          ? PyDict_GetItemWithError(topics, SLOT(pub, pub_topic))
                          : NULL;
    Py_DECREF(topics);
    if (topic == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!Py_IS_TYPE(topic, TopicType))
        return 0;
    PyObject *guarantee = SLOT(topic, top_guarantee);
    if (guarantee == NULL || !PyTuple_Check(guarantee) || PyTuple_GET_SIZE(guarantee) < 1)
        return 0;
    int exact = PyObject_RichCompareBool(PyTuple_GET_ITEM(guarantee, 0), exactly_once, Py_EQ);
    if (exact <= 0)
        return exact;
    long long n;
    if (!int_of(SLOT(pub, pub_credit), &n) || !int_of(SLOT(pub, pub_next_seq), &n) ||
        !int_of(SLOT(topic, top_outstanding_credit), &n) || !int_of(SLOT(topic, top_est), &n) ||
        !int_of(SLOT(topic, top_largest_recent), &n) || !int_of(SLOT(topic, top_unsettled), &n) ||
        !int_of(SLOT(topic, top_bytes), &n) || !int_of(SLOT(topic, top_published), &n))
        return PyErr_Occurred() ? -1 : 0;
    /* owed to every subscription here: no selector, none best-effort, none holding placeholders */
    PyObject *roster = SLOT(topic, top_roster), *subscriptions = SLOT(topic, top_subscriptions);
    if (roster == NULL || !Py_IS_TYPE(roster, RosterType) || SLOT(roster, ros_selective) != Py_False ||
        subscriptions == NULL || !PyDict_CheckExact(subscriptions))
        return 0;
    PyObject *subs = SLOT(roster, ros_subs), *keys = SLOT(roster, ros_keys);
    if (subs == NULL || !PyTuple_CheckExact(subs) || PyTuple_GET_SIZE(subs) == 0 ||
        PyTuple_GET_SIZE(subs) != PyDict_GET_SIZE(subscriptions) || keys == NULL ||
        !(PyList_CheckExact(keys) || PyTuple_CheckExact(keys)) ||
        PySequence_Fast_GET_SIZE(keys) != PyTuple_GET_SIZE(subs))
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(subs); i++) {
        PyObject *sub = PyTuple_GET_ITEM(subs, i);
        if (!Py_IS_TYPE(sub, SubscriptionType) || truth(SLOT(sub, sub_placeholders)) != 0 || SLOT(sub, sub_queue) == NULL ||
            SLOT(sub, sub_link_id) == NULL || SLOT(sub, sub_ready) == NULL)
            return PyErr_Occurred() ? -1 : 0;
    }
    /* no other router interested (known: the network's cache), none lost */
    PyObject *net = get_attr(m->core, a_net);
    PyObject *interest = net == NULL ? NULL : get_attr(net, a_interest);
    Py_XDECREF(net);
    if (interest == NULL)
        return -1;
    PyObject *interested = PyDict_CheckExact(interest) ? PyDict_GetItemWithError(interest, SLOT(topic, top_name)) : NULL;
    int none_interested = interested == NULL ? 0 : truth(interested) == 0;
    Py_DECREF(interest);
    if (!none_interested)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *lost = get_attr(m->core, a_lost);
    int any_lost = truth(lost);
    Py_XDECREF(lost);
    if (any_lost != 0)
        return any_lost < 0 && PyErr_Occurred() ? -1 : 0;
    /* a new delivery: its tag (tags.outgoing_tag, inlined for short tags) held by no
     * record and not in its stream's settled memory (a reuse) */
    PyObject *stream = SLOT(pub, pub_stream), *memory = SLOT(pub, pub_memory);
    if (stream == NULL || !PyBytes_CheckExact(stream) || memory == NULL || !Py_IS_TYPE(memory, MemoryType))
        return 0;
    PyObject *current = SLOT(memory, mem_current), *previous = SLOT(memory, mem_previous);
    if (current == NULL || previous == NULL || !PyDict_CheckExact(current) || !PyDict_CheckExact(previous))
        return 0;
    Py_ssize_t ns = PyBytes_GET_SIZE(stream), nt = PyBytes_GET_SIZE(ptag);
    PyObject *tag = PyBytes_FromStringAndSize(NULL, ns + 1 + nt);
    if (tag == NULL)
        return -1;
    char *t = PyBytes_AS_STRING(tag);
    memcpy(t, PyBytes_AS_STRING(stream), (size_t)ns);
    t[ns] = (char)nt;
    memcpy(t + ns + 1, PyBytes_AS_STRING(ptag), (size_t)nt);
    PyObject *records = get_attr(m->core, a_records);
    PyObject *by_delivery = records == NULL ? NULL : get_attr(m->core, a_by_delivery);
    int fresh = by_delivery != NULL && PyDict_CheckExact(records) && PyDict_CheckExact(by_delivery);
    if (fresh) {
        int held = PyDict_Contains(records, tag);
        int in_current = held == 0 ? PyDict_Contains(current, tag) : held;
        int in_previous = in_current == 0 ? PyDict_Contains(previous, tag) : in_current;
        fresh = in_previous == 0 ? 1 : in_previous < 0 ? -1 : 0;
    } else if (by_delivery == NULL) {
        fresh = -1;
    }
    if (fresh <= 0) {
        Py_DECREF(tag);
        Py_XDECREF(records);
        Py_XDECREF(by_delivery);
        return fresh;
    }
    /* held (the Python methods admit() calls could, in principle, replace them) */
    m->pub = Py_NewRef(pub), m->topic = Py_NewRef(topic), m->roster = Py_NewRef(roster);
    m->memory = Py_NewRef(memory), m->tag = tag, m->records = records, m->by_delivery = by_delivery;
    return 1;
}

/* _refill_credit(topic, out, bound_only=True) when a grant may be due: its first test
 * here (no grant due by count), and the end when it grants nothing (grants_nothing);
 * the rest by the Python method. */
static int refill_bound_only(message_t *m, PyObject *settings) {
    long long limit, window_setting;
    if (attr_int(settings, a_max_in_flight, &limit) < 0 || attr_int(settings, a_credit_window, &window_setting) < 0)
        return -1;
    PyObject *publishers = get_attr(m->topic, a_publishers);
    if (publishers == NULL)
        return -1;
    Py_ssize_t npub = PyDict_CheckExact(publishers) ? PyDict_GET_SIZE(publishers) : 0;
    long long unsettled, credit;
    if (npub > 0 && limit > 0 && int_of(SLOT(m->topic, top_unsettled), &unsettled) &&
        int_of(SLOT(m->topic, top_outstanding_credit), &credit)) {
        long long window = limit / npub;
        if (window > window_setting)
            window = window_setting;
        if (window < 1)
            window = 1;
        PyObject *starved = (limit - unsettled - credit) * 8 < window ? NULL : get_attr(m->core, a_starved);
        int nothing = starved == NULL || grants_nothing(publishers, starved, window, PublisherType, pub_credit,
                                                        pub_presettled);
        Py_XDECREF(starved);
        if (nothing) {
            Py_DECREF(publishers);
            return PyErr_Occurred() ? -1 : 0;
        }
    }
    Py_DECREF(publishers);
    PyObject *r = PyObject_CallMethodObjArgs(m->core, m_refill_credit, m->topic, m->out, Py_True, NULL);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* _prepare_payload for the usual message (sections.py's _scan fast path: an empty
 * header and/or empty properties, then one data section that ends the message): the
 * origin annotation's section spliced in where _scan says (message.py splice_origin),
 * no expiry. 1: *spliced is the new message; 0: not that shape, or the publisher's
 * template or its piece for this tag's length not made yet (the Python method's);
 * -1: error. */
static int splice_simple(message_t *m, PyObject **spliced) {
    PyObject *payload = PyTuple_GET_ITEM(m->ev, 3), *ptag = PyTuple_GET_ITEM(m->ev, 2);
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(payload);
    Py_ssize_t n = PyBytes_GET_SIZE(payload);
    Py_ssize_t i = n >= 4 && memcmp(p, empty_header, 4) == 0 ? 4 : 0;
    Py_ssize_t j = n >= i + 4 && memcmp(p + i, empty_properties, 4) == 0 ? i + 4 : i;
    if (!(n > j + 4 && memcmp(p + j, data_descriptor, 3) == 0))
        return 0;
    unsigned char v = p[j + 3];
    int whole;
    if (v == 0xA0)
        whole = j + 5 + p[j + 4] == n;
    else if (v == 0xB0 && n > j + 8)
        whole = j + 8 + (Py_ssize_t)(((uint32_t)p[j + 4] << 24) | ((uint32_t)p[j + 5] << 16) | ((uint32_t)p[j + 6] << 8) |
                                     (uint32_t)p[j + 7]) == n;
    else
        whole = 0;
    if (!whole)
        return 0;
    PyObject *template = SLOT(m->pub, pub_origin);
    if (template == NULL || !Py_IS_TYPE(template, TemplateType))
        return 0;
    PyObject *heads = SLOT(template, tpl_section_heads), *tail = SLOT(template, tpl_tail);
    if (heads == NULL || tail == NULL || !PyDict_CheckExact(heads) || !PyBytes_CheckExact(tail))
        return 0;
    PyObject *size = PyLong_FromSsize_t(PyBytes_GET_SIZE(ptag));
    if (size == NULL)
        return -1;
    PyObject *head = PyDict_GetItemWithError(heads, size);
    Py_DECREF(size);
    if (head == NULL || !PyBytes_CheckExact(head))
        return PyErr_Occurred() ? -1 : 0;
    Py_ssize_t nh = PyBytes_GET_SIZE(head), nt = PyBytes_GET_SIZE(ptag), nl = PyBytes_GET_SIZE(tail);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n + nh + nt + nl);
    if (out == NULL)
        return -1;
    char *o = PyBytes_AS_STRING(out);
    memcpy(o, p, (size_t)i);
    memcpy(o + i, PyBytes_AS_STRING(head), (size_t)nh);
    memcpy(o + i + nh, PyBytes_AS_STRING(ptag), (size_t)nt);
    memcpy(o + i + nh + nt, PyBytes_AS_STRING(tail), (size_t)nl);
    memcpy(o + i + nh + nt + nl, p + i, (size_t)(n - i));
    *spliced = out;
    return 1;
}

/* The usual case, in admission.py's order. */
static int admit(message_t *m) {
    PyObject *core = m->core, *ev = m->ev, *pub = m->pub, *topic = m->topic, *out = m->out;
    PyObject *ptag = PyTuple_GET_ITEM(ev, 2), *payload = PyTuple_GET_ITEM(ev, 3), *delivery = PyTuple_GET_ITEM(ev, 1);
    long long credit = 0, outstanding = 0, est = 0, largest = 0, promised = 0;
    int_of(SLOT(pub, pub_credit), &credit);
    int_of(SLOT(topic, top_outstanding_credit), &outstanding);
    int_of(SLOT(topic, top_est), &est);
    int_of(SLOT(topic, top_largest_recent), &largest);
    /* counted against its credit and the topic's size estimate */
    if (credit > 0 || PyBytes_GET_SIZE(payload) > largest) {
        if (attr_int(core, a_promised, &promised) < 0)
            return -1;
        if (credit > 0) {
            if (set_int(pub, pub_credit, credit - 1) < 0 || set_int(topic, top_outstanding_credit, outstanding - 1) < 0)
                return -1;
            outstanding -= 1;
            promised -= est;
        }
        long long size = PyBytes_GET_SIZE(payload);
        if (size > largest) {
            if (set_int(topic, top_largest_recent, size) < 0)
                return -1;
            if (size > est) {
                promised += outstanding * (size - est);
                if (set_int(topic, top_est, size) < 0)
                    return -1;
            }
        }
        if (set_attr_int(core, a_promised, promised) < 0)
            return -1;
    }
    /* numbered in its stream */
    PyObject *seq = SLOT(pub, pub_next_seq);
    Py_INCREF(seq);
    long long seq_value = 0;
    int_of(seq, &seq_value);
    PyObject *stream_seq = get_attr(core, a_stream_seq);
    int failed = stream_seq == NULL || set_int(pub, pub_next_seq, seq_value + 1) < 0 ||
                 PyObject_SetItem(stream_seq, SLOT(pub, pub_stream), seq) < 0;
    Py_XDECREF(stream_seq);
    if (failed) {
        Py_DECREF(seq);
        return -1;
    }
    /* prepared: the origin annotation spliced in, its expiry (None: refused there) */
    PyObject *spliced_here = NULL;
    int simple = splice_simple(m, &spliced_here);
    PyObject *prepared = simple < 0   ? NULL
                         : simple > 0 ? PyTuple_Pack(2, spliced_here, Py_None)
                                      : PyObject_CallMethodObjArgs(core, m_prepare_payload, pub, ev, m->now, out, NULL);
    Py_XDECREF(spliced_here);
    if (prepared == NULL || prepared == Py_None) {
        Py_DECREF(seq);
        Py_XDECREF(prepared);
        return prepared == NULL ? -1 : 0;
    }
    PyObject *record = NULL, *settings = NULL, *sent_to = NULL, *answers = NULL, *order = NULL;
    int ok = 0;
    if (!PyTuple_Check(prepared) || PyTuple_GET_SIZE(prepared) != 2 || !PyBytes_CheckExact(PyTuple_GET_ITEM(prepared, 0))) {
        PyErr_SetString(PyExc_TypeError, "_prepare_payload gave something else than (bytes, expiry)");
        goto done;
    }
    PyObject *spliced = PyTuple_GET_ITEM(prepared, 0), *expires_at = PyTuple_GET_ITEM(prepared, 1);
    long long published = 0;
    int_of(SLOT(topic, top_published), &published);
    if (set_int(topic, top_published, published + 1) < 0)
        goto done;
    /* the record (_new_record) */
    PyObject *counter = get_attr(core, a_order);
    order = counter == NULL ? NULL : PyIter_Next(counter);
    Py_XDECREF(counter);
    if (order == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "the core's order counter ended");
        goto done;
    }
    PyObject *args[13] = {m->tag, SLOT(topic, top_name), order, spliced, SLOT(pub, pub_container_id),
                          SLOT(pub, pub_name), ptag, SLOT(pub, pub_incarnation), seq, SLOT(pub, pub_link_id),
                          delivery, expires_at, zero};
    record = new_record(args);
    if (record == NULL)
        goto done;
    set_slot(record, rec_arrived, m->now);
    set_slot(record, rec_memory, m->memory);
    /* _distribute: owed to the whole roster; sent to those that can take it now */
    PyObject *roster = m->roster, *subs = SLOT(roster, ros_subs), *keys = SLOT(roster, ros_keys);
    Py_ssize_t n = PyTuple_GET_SIZE(subs);
    answers = PyByteArray_FromStringAndSize(NULL, n);
    if (answers == NULL)
        goto done;
    memset(PyByteArray_AS_STRING(answers), 0, (size_t)n);
    set_slot(record, rec_roster, roster);
    set_slot(record, rec_answers, answers);
    long long send_counter;
    if (attr_int(core, a_send_counter, &send_counter) < 0)
        goto done;
    PyObject *sent_at = PyLong_FromLongLong(send_counter + 1); /* (one int for both: they are equal) */
    int counted = sent_at == NULL ? -1 : set_attr(core, a_send_counter, sent_at);
    if (counted == 0)
        set_slot(record, rec_sent_at, sent_at);
    Py_XDECREF(sent_at);
    if (counted < 0)
        goto done;
    int unsent = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *sub = PyTuple_GET_ITEM(subs, i);
        PyObject *link_id = SLOT(sub, sub_link_id);
        long long sub_credit_value = 0;
        int can = link_id != Py_None && int_of(SLOT(sub, sub_credit), &sub_credit_value) && sub_credit_value > 0;
        if (can) {
            int ready = truth(SLOT(sub, sub_ready));
            int queued = ready > 0 ? truth(SLOT(sub, sub_queue)) : 0;
            int holding = ready > 0 && queued == 0 ? truth(SLOT(sub, sub_placeholders)) : 0;
            if (ready < 0 || queued < 0 || holding < 0)
                goto done;
            can = ready && !queued && !holding;
        } else if (PyErr_Occurred()) {
            goto done;
        }
        if (can) {
            if (set_int(sub, sub_credit, sub_credit_value - 1) < 0)
                goto done;
            PyObject *items[4] = {link_id, m->tag, spliced, Py_False};
            if (append_new(out, command(ForwardType, 4, items)) < 0)
                goto done;
        } else {
            PyByteArray_AS_STRING(answers)[i] = (char)answer_unsent;
            unsent = 1;
            if (link_id != Py_None) {
                PyObject *r = PyObject_CallMethod(SLOT(sub, sub_queue), "append", "O", record);
                Py_XDECREF(r);
                if (r == NULL)
                    goto done;
            }
        }
    }
    if (!unsent) {
        sent_to = Py_NewRef(keys);
    } else {
        sent_to = PyList_New(0);
        if (sent_to == NULL)
            goto done;
        for (Py_ssize_t i = 0; i < n; i++)
            if (!PyByteArray_AS_STRING(answers)[i] && PyList_Append(sent_to, PySequence_Fast_GET_ITEM(keys, i)) < 0)
                goto done;
    }
    /* _fan_out */
    if (set_int(record, rec_waiting, n) < 0)
        goto done;
    /* its "received" line: a Received (commands.py), a tuple the adapter writes without a dict */
    PyObject *size = PyLong_FromSsize_t(PyBytes_GET_SIZE(payload));
    if (size == NULL)
        goto done;
    PyObject *received_items[11] = {SLOT(record, rec_delivery_id), SLOT(topic, top_name), SLOT(pub, pub_container_id),
                                    SLOT(pub, pub_name), ptag, SLOT(pub, pub_incarnation), seq, size, keys, sent_to,
                                    Py_None};
    int logged = append_new(out, command(ReceivedType, 11, received_items));
    Py_DECREF(size);
    if (logged < 0)
        goto done;
    /* kept: by tag, by the publisher's delivery, in the topic's publisher order */
    if (PyDict_SetItem(m->records, m->tag, record) < 0 || PyDict_SetItem(m->by_delivery, delivery, record) < 0 ||
        PyObject_SetItem(SLOT(topic, top_records), SLOT(record, rec_order), record) < 0)
        goto done;
    long long unsettled = 0, bytes = 0, held_total = 0;
    int_of(SLOT(topic, top_unsettled), &unsettled);
    if (set_int(topic, top_unsettled, unsettled + 1) < 0)
        goto done;
    Py_ssize_t held = PyBytes_GET_SIZE(spliced);
    if (held >= uncounted_below) {
        int_of(SLOT(topic, top_bytes), &bytes);
        if (set_int(topic, top_bytes, bytes + held) < 0 || attr_int(core, a_bytes_held, &held_total) < 0 ||
            set_attr_int(core, a_bytes_held, held_total + held) < 0)
            goto done;
    }
    if (expires_at != Py_None) {
        PyObject *r = PyObject_CallMethodObjArgs(core, m_add_timer, expires_at, timer_expiry, record, NULL);
        Py_XDECREF(r);
        if (r == NULL)
            goto done;
    }
    settings = get_attr(core, a_settings);
    long long window = 0, credit_now = 0;
    if (settings == NULL || attr_int(settings, a_credit_window, &window) < 0)
        goto done;
    if (int_of(SLOT(pub, pub_credit), &credit_now) && credit_now * 2 < window && refill_bound_only(m, settings) < 0)
        goto done;
    if (PyErr_Occurred())
        goto done;
    ok = 1;
done:
    Py_DECREF(seq);
    Py_DECREF(prepared);
    Py_XDECREF(record);
    Py_XDECREF(settings);
    Py_XDECREF(sent_to);
    Py_XDECREF(answers);
    Py_XDECREF(order);
    return ok ? 0 : -1;
}

PyDoc_STRVAR(on_message_doc,
             "on_message(core, event, now, out)\n\n"
             "RouterCore._on_message(event, now, out) for ``core``: the same commands in ``out``, the\n"
             "same state after (router/core/_admission.c says which case it takes itself).");

/* The message into ``out`` (on_message's work): 0, or -1 with an error set. */
static int message_into(PyObject *core, PyObject *ev, PyObject *now, PyObject *out) {
    message_t m = {core, ev, now, out, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    int u = usual(&m);
    if (u < 0)
        return -1;
    if (u == 0) {
        PyObject *r = PyObject_CallMethodObjArgs(core, m_on_message, ev, now, out, NULL);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    int r = admit(&m);
    Py_DECREF(m.pub);
    Py_DECREF(m.topic);
    Py_DECREF(m.roster);
    Py_DECREF(m.memory);
    Py_DECREF(m.tag);
    Py_DECREF(m.records);
    Py_DECREF(m.by_delivery);
    return r;
}

static PyObject *on_message(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "on_message(core, event, now, out: list)");
        return NULL;
    }
    if (!bound) {
        PyErr_SetString(PyExc_RuntimeError, "on_message: bind() first");
        return NULL;
    }
    if (message_into(args[0], args[1], args[2], args[3]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(handle_message_doc,
             "handle_message(core, event, now) -> list\n\n"
             "RouterCore.handle(event, now) for ``core`` and a MessageReceived ``event``, its handler\n"
             "being on_message: the same commands, the same state after.");

/* RouterCore.handle (router.py) for a publisher's message: the handler, then the
 * credit refills other topics wait for and the end of a shutdown, as handle() does. */
static PyObject *handle_message(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "handle_message(core, event, now)");
        return NULL;
    }
    if (!bound) {
        PyErr_SetString(PyExc_RuntimeError, "handle_message: bind() first");
        return NULL;
    }
    PyObject *core = args[0], *now = args[2];
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    if (message_into(core, args[1], now, out) < 0)
        goto fail;
    PyObject *pending = get_attr(core, a_pending_refills);
    int refills = truth(pending);
    Py_XDECREF(pending);
    if (refills < 0)
        goto fail;
    if (refills) {
        PyObject *r = PyObject_CallMethodOneArg(core, m_refill_pending, out);
        Py_XDECREF(r);
        if (r == NULL)
            goto fail;
    }
    PyObject *draining = get_attr(core, a_draining);
    int is_draining = truth(draining);
    Py_XDECREF(draining);
    if (is_draining < 0)
        goto fail;
    if (is_draining) {
        PyObject *done = get_attr(core, a_shutdown_done);
        int is_done = truth(done);
        Py_XDECREF(done);
        if (is_done < 0)
            goto fail;
        if (!is_done) {
            PyObject *r = PyObject_CallMethodObjArgs(core, m_maybe_finish_shutdown, now, out, NULL);
            Py_XDECREF(r);
            if (r == NULL)
                goto fail;
        }
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

PyDoc_STRVAR(attribute_doc,
             "attribute(o, name[, value]) -> value\n\n"
             "getattr(o, name), or setattr(o, name, value), as the twins do them (router/core/_attrs.h:\n"
             "a plain slot by its offset, anything else as Python does it): for the tests that hold\n"
             "the two to the same results.");

static PyObject *attribute(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if ((nargs != 2 && nargs != 3) || !PyUnicode_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "attribute(o, name: str[, value])");
        return NULL;
    }
    PyObject *name = Py_NewRef(args[1]);
    PyUnicode_InternInPlace(&name);
    PyObject *result;
    if (nargs == 2)
        result = get_attr(args[0], name);
    else
        result = set_attr(args[0], name, args[2]) < 0 ? NULL : Py_NewRef(args[2]);
    Py_DECREF(name);
    return result;
}

/* ------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL, bind_doc},
    {"on_message", (PyCFunction)(void (*)(void))on_message, METH_FASTCALL, on_message_doc},
    {"handle_message", (PyCFunction)(void (*)(void))handle_message, METH_FASTCALL, handle_message_doc},
    {"attribute", (PyCFunction)(void (*)(void))attribute, METH_FASTCALL, attribute_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "router.core._admission",
    "The compiled twin of the core's handling of a publisher's message (router/core/_admission.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__admission(void) {
    if ((zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    INTERN(a_publishers, "publishers");
    INTERN(a_topics, "topics");
    INTERN(a_draining, "draining");
    INTERN(a_stream_seq, "stream_seq");
    INTERN(a_records, "records");
    INTERN(a_by_delivery, "by_delivery");
    INTERN(a_net, "net");
    INTERN(a_interest, "_interest");
    INTERN(a_lost, "lost");
    INTERN(a_order, "_order");
    INTERN(a_send_counter, "_send_counter");
    INTERN(a_promised, "_promised");
    INTERN(a_bytes_held, "bytes_held");
    INTERN(a_settings, "settings");
    INTERN(a_credit_window, "publisher_credit_window");
    INTERN(a_max_in_flight, "max_in_flight_per_topic");
    INTERN(a_starved, "_starved");
    INTERN(a_pending_refills, "_pending_refills");
    INTERN(a_shutdown_done, "_shutdown_done");
    INTERN(m_refill_pending, "_refill_pending");
    INTERN(m_maybe_finish_shutdown, "_maybe_finish_shutdown");
    INTERN(m_on_message, "_on_message");
    INTERN(m_prepare_payload, "_prepare_payload");
    INTERN(m_add_timer, "_add_timer");
    INTERN(m_refill_credit, "_refill_credit");
    return PyModule_Create(&module);
}
