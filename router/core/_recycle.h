/* Instances of the core's commands and events (NamedTuple classes: tuples of a fixed
 * size) kept for reuse when they die, as CPython keeps its own tuples, instead of
 * freed and allocated again: the relay path makes four or five of them per message
 * (Received, Forward, Completed, SendOutcome, MessageReceived), and a heap type's
 * allocation (GC-tracked, the type's reference) and its deallocation (subtype_dealloc)
 * cost ~400 instructions each time (bench/callgrind.py, issue 21).
 *
 * recycle_install(type, n) replaces the type's tp_dealloc by one that, for the
 * instances of that very type and of size n, clears the items, untracks the instance
 * and keeps it (up to RECYCLE_KEEP); anything else (a subclass's instance, another
 * size, a full list) is torn down as subtype_dealloc would. recycled_new(type, n) takes a kept instance or
 * allocates one. A kept instance holds no items and no references but its type's (which
 * it held alive: it is given back with it), and Python code never sees it: only a dead
 * instance is kept. Each module that includes this header keeps its own lists; a type
 * is installed by the module that makes its instances (it may die anywhere). Not in a
 * build where reference counts are traced or the GIL is off: there, installing does
 * nothing and recycled_new allocates. */

#ifndef EOROUTER_RECYCLE_H
#define EOROUTER_RECYCLE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if defined(Py_TRACE_REFS) || defined(Py_GIL_DISABLED)
#define RECYCLE_OFF 1
#else
#define RECYCLE_OFF 0
#endif

#define RECYCLE_TYPES 4
#define RECYCLE_KEEP 256

typedef struct {
    PyTypeObject *type; /* held */
    Py_ssize_t size;
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

/* What subtype_dealloc does for an instance of a plain NamedTuple (nothing of its own
 * to clear): the tuple's teardown (its items, its memory), then the reference to its
 * heap type. (subtype_dealloc itself cannot be called once the type's tp_dealloc is
 * replaced: it looks for the nearest base whose tp_dealloc is not its own, and would
 * find the type itself.) Also what a subclass's subtype_dealloc expects of this as
 * its base's: its base is then a heap type, whose deallocator drops the reference. */
static void recycle_teardown(PyObject *op) {
    PyTypeObject *type = Py_TYPE(op);
    PyTuple_Type.tp_dealloc(op);
    Py_DECREF(type);
}

static void recycling_dealloc(PyObject *op) {
    recycler *r = recycler_of(Py_TYPE(op));
    if (r == NULL || r->kept == RECYCLE_KEEP || Py_SIZE(op) != r->size) {
        recycle_teardown(op);
        return;
    }
    PyObject_GC_UnTrack(op);
    for (Py_ssize_t i = 0; i < r->size; i++)
        Py_CLEAR(((PyTupleObject *)op)->ob_item[i]);
    /* (clearing ran the items' deallocators, which may have kept others meanwhile) */
    if (r->kept == RECYCLE_KEEP) {
        recycle_teardown(op); /* (untracked already: the tuple's teardown checks) */
        return;
    }
    r->free[r->kept++] = op;
}

/* Keep ``type``'s dead instances of size ``n`` for reuse: 0, or -1 with an error set.
 * A type that is not a plain NamedTuple (extra slots, a dict, weak references, a
 * finalizer) or has no room left here is left as it is (0). */
static int recycle_install(PyTypeObject *type, Py_ssize_t n) {
    if (RECYCLE_OFF || recycler_of(type) != NULL)
        return 0;
    if (!(type->tp_flags & Py_TPFLAGS_HEAPTYPE) || type->tp_base != &PyTuple_Type ||
        type->tp_basicsize != PyTuple_Type.tp_basicsize || type->tp_itemsize != PyTuple_Type.tp_itemsize ||
        type->tp_dictoffset != 0 || type->tp_weaklistoffset != 0 || type->tp_finalize != NULL || type->tp_del != NULL ||
        type->tp_dealloc == recycling_dealloc || n < 1 || !PyType_IS_GC(type))
        return 0;
    for (int i = 0; i < RECYCLE_TYPES; i++) {
        if (recyclers[i].type == NULL) {
            Py_INCREF(type);
            recyclers[i].type = type;
            recyclers[i].size = n;
            recyclers[i].kept = 0;
            type->tp_dealloc = recycling_dealloc;
            return 0;
        }
    }
    return 0;
}

/* A new instance of ``type`` of size ``n`` with its items unset (NULL), as tp_alloc
 * gives it: a kept one if there is one. NULL with an error set. */
static inline PyObject *recycled_new(PyTypeObject *type, Py_ssize_t n) {
    recycler *r = RECYCLE_OFF ? NULL : recycler_of(type);
    if (r == NULL || r->kept == 0 || r->size != n)
        return type->tp_alloc(type, n);
    PyObject *op = r->free[--r->kept];
    Py_SET_REFCNT(op, 1);
    PyObject_GC_Track(op);
    return op;
}

#endif
