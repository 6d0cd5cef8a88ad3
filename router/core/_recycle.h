/* Instances of the core's commands and events (NamedTuple classes: tuples of a fixed
 * size) and of its delivery records (a class of __slots__ only) kept for reuse when they
 * die, as CPython keeps its own tuples, instead of freed and allocated again: the relay
 * path makes four or five commands and events per message (MessageReceived, Received,
 * Forward, Completed, SendOutcome) and a record, and a heap type's allocation
 * (GC-tracked, the type's reference) and its deallocation (subtype_dealloc) cost ~400
 * instructions each time (bench/callgrind.py, issue 21).
 *
 * recycle_install(type, slotted, n) replaces the type's tp_dealloc by one that, for the
 * instances of that very type (and of size n, a NamedTuple's), clears their items or
 * slots, untracks them and keeps them (up to RECYCLE_KEEP); anything else (a subclass's
 * instance, another size, a full list) is torn down as subtype_dealloc would.
 * recycled_new(type, n) takes a kept instance or allocates one. A kept instance holds
 * no references but its type's (which it held alive: it is given back with it), and
 * Python code never sees it: only a dead instance is kept. Each module that includes
 * this header keeps its own lists; a type is installed by the module that makes its
 * instances (they may die anywhere). Not in a build where reference counts are traced
 * or the GIL is off: there, installing does nothing and recycled_new allocates. */

#ifndef EOROUTER_RECYCLE_H
#define EOROUTER_RECYCLE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#if defined(Py_TRACE_REFS) || defined(Py_GIL_DISABLED)
#define RECYCLE_OFF 1
#else
#define RECYCLE_OFF 0
#endif

#define RECYCLE_TYPES 8
#define RECYCLE_KEEP 256

typedef struct {
    PyTypeObject *type; /* held */
    int slotted;        /* 0: a NamedTuple of ``size`` items; 1: a class of __slots__ only */
    Py_ssize_t size;    /* a NamedTuple's items, a slotted class's slots */
    Py_ssize_t first;   /* where they begin in an instance: one array of references */
    int kept;
    PyObject *free[RECYCLE_KEEP];
} recycler;

static recycler recyclers[RECYCLE_TYPES];

static inline recycler *recycler_of(PyTypeObject *type) {
    for (int i = 0; i < RECYCLE_TYPES; i++)
        if (recyclers[i].type == type)
            return &recyclers[i];
    return NULL;
}

/* An instance's references cleared: a NamedTuple's items, a slotted class's slots
 * (what subtype_dealloc's clear_slots does for the class's own). */
static void recycle_clear(PyObject *op, recycler *r) {
    PyObject **at = (PyObject **)((char *)op + r->first);
    for (Py_ssize_t i = 0; i < r->size; i++)
        Py_CLEAR(at[i]);
}

/* What subtype_dealloc does for an instance of a plain NamedTuple or slotted class
 * (``r``'s): the class's own slots cleared, then the base's teardown (a tuple's: its
 * items and memory; an object's: its memory), then the reference to its heap type.
 * (subtype_dealloc itself cannot be called once the type's tp_dealloc is replaced: it
 * looks for the nearest base whose tp_dealloc is not its own, and would find the type
 * itself.) Also what a subclass's subtype_dealloc expects of this as its base's: it
 * cleared the subclass's own slots, and its base is then a heap type, whose
 * deallocator drops the reference. */
static void recycle_teardown(PyObject *op, recycler *r) {
    PyTypeObject *type = Py_TYPE(op);
    if (r->slotted) {
        PyObject_GC_UnTrack(op);
        recycle_clear(op, r);
        PyBaseObject_Type.tp_dealloc(op);
    } else {
        PyTuple_Type.tp_dealloc(op);
    }
    Py_DECREF(type);
}

static void recycling_dealloc(PyObject *op) {
    recycler *r = recycler_of(Py_TYPE(op));
    if (r == NULL) { /* a subclass's instance: this is its base's deallocator */
        PyTypeObject *base = Py_TYPE(op)->tp_base;
        while (base != NULL && (r = recycler_of(base)) == NULL)
            base = base->tp_base;
        if (r == NULL) /* (cannot be: some base installed this) */
            Py_FatalError("_recycle.h: an instance of no recycled class");
        recycle_teardown(op, r);
        return;
    }
    if (r->kept == RECYCLE_KEEP || (!r->slotted && Py_SIZE(op) != r->size)) {
        recycle_teardown(op, r);
        return;
    }
    PyObject_GC_UnTrack(op);
    recycle_clear(op, r);
    /* (clearing ran the deallocators of what it held, which may have kept others meanwhile) */
    if (r->kept == RECYCLE_KEEP) {
        recycle_teardown(op, r); /* (untracked and cleared already: both are checked) */
        return;
    }
    r->free[r->kept++] = op;
}

/* Whether ``type`` may be recycled: a heap type collected by the GC, of no finalizer,
 * dict or weak references, whose instances are a tuple's (a NamedTuple: slotted 0) or
 * nothing but __slots__ (slotted 1: how many learnt into r; they are one array of
 * references after the object's head, checked). */
static int recyclable(PyTypeObject *type, int slotted, recycler *r) {
    if (!(type->tp_flags & Py_TPFLAGS_HEAPTYPE) || !PyType_IS_GC(type) || type->tp_dictoffset != 0 ||
        type->tp_weaklistoffset != 0 || type->tp_finalize != NULL || type->tp_del != NULL ||
        type->tp_dealloc == recycling_dealloc)
        return 0;
    if (!slotted)
        return type->tp_base == &PyTuple_Type && type->tp_basicsize == PyTuple_Type.tp_basicsize &&
               type->tp_itemsize == PyTuple_Type.tp_itemsize;
    if (type->tp_base != &PyBaseObject_Type || type->tp_itemsize != 0 || type->tp_members == NULL)
        return 0;
    Py_ssize_t n = 0, first = (Py_ssize_t)sizeof(PyObject), end = type->tp_basicsize;
    for (PyMemberDef *m = type->tp_members; m->name != NULL; m++, n++) {
        Py_ssize_t off = m->offset;
        if (m->type != T_OBJECT_EX || off < first || off >= end || (off - first) % (Py_ssize_t)sizeof(PyObject *) != 0)
            return 0;
    }
    if (end != first + n * (Py_ssize_t)sizeof(PyObject *)) /* (n distinct places in n: each slot once) */
        return 0;
    r->size = n;
    r->first = first;
    return 1;
}

/* Keep ``type``'s dead instances for reuse: a NamedTuple's of size ``n`` (slotted 0),
 * or a slotted class's (slotted 1, n unused). 0, or -1 with an error set. A class not of
 * those shapes (recyclable), or with no room left here, is left as it is (0). */
static int recycle_install(PyTypeObject *type, int slotted, Py_ssize_t n) {
    if (RECYCLE_OFF || recycler_of(type) != NULL || (!slotted && n < 1))
        return 0;
    for (int i = 0; i < RECYCLE_TYPES; i++) {
        recycler *r = &recyclers[i];
        if (r->type == NULL) {
            if (!recyclable(type, slotted, r))
                return 0;
            Py_INCREF(type);
            r->type = type;
            r->slotted = slotted;
            if (!slotted) {
                r->size = n;
                r->first = (Py_ssize_t)offsetof(PyTupleObject, ob_item);
            }
            r->kept = 0;
            type->tp_dealloc = recycling_dealloc;
            return 0;
        }
    }
    return 0;
}

/* A new instance of ``type`` (of size ``n``: a NamedTuple's; 0 for a slotted class)
 * with its items or slots unset (NULL), as tp_alloc gives it: a kept one if there is
 * one. NULL with an error set. */
static inline PyObject *recycled_new(PyTypeObject *type, Py_ssize_t n) {
    recycler *r = RECYCLE_OFF ? NULL : recycler_of(type);
    if (r == NULL || r->kept == 0 || (!r->slotted && r->size != n))
        return type->tp_alloc(type, n);
    PyObject *op = r->free[--r->kept];
    Py_SET_REFCNT(op, 1);
    PyObject_GC_Track(op);
    return op;
}

#endif
