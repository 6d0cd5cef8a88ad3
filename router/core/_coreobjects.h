/* What the core's compiled twins (_admission.c, _answers.c) share: reaching the core's
 * objects through their __slots__' offsets, Python's truth of a slot's value, and the
 * core's commands (NamedTuples) made as tuple.__new__ makes them (constants._new).
 *
 * A slot's offset comes from its member descriptor, read once at bind(): a field that
 * is no longer a plain slot makes bind() fail, and the core then runs in Python. */

#ifndef EOROUTER_COREOBJECTS_H
#define EOROUTER_COREOBJECTS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_attrs.h"
#include "_recycle.h"


typedef struct {
    const char *name;
    Py_ssize_t *offset;
} slot_def;

static int slot_offsets(PyTypeObject *type, const slot_def *defs) {
    for (; defs->name != NULL; defs++) {
        PyObject *descr = PyDict_GetItemString(type->tp_dict, defs->name);
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
            ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type->tp_name, defs->name);
            return -1;
        }
        *defs->offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    }
    return 0;
}

/* Python's truth of a slot's value (a missing slot counts as -1: not the usual case). */
static inline int truth(PyObject *o) {
    if (o == NULL)
        return -1;
    if (o == Py_None || o == Py_False)
        return 0;
    if (o == Py_True)
        return 1;
    if (PyDict_CheckExact(o))
        return PyDict_GET_SIZE(o) != 0;
    if (PyAnySet_CheckExact(o))
        return PySet_GET_SIZE(o) != 0;
    return PyObject_IsTrue(o);
}

/* An instance of a NamedTuple command, as tuple.__new__ makes it (a kept one when its
 * type is installed for reuse: _recycle.h). */
static PyObject *command(PyTypeObject *type, Py_ssize_t n, PyObject **items) {
    PyObject *t = recycled_new(type, n);
    if (t == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF(items[i]);
        PyTuple_SET_ITEM(t, i, items[i]);
    }
    return t;
}

/* list.append(item), the item's reference stolen (NULL: an error already set). */
static int append_new(PyObject *list, PyObject *item) {
    if (item == NULL)
        return -1;
    int r = PyList_Append(list, item);
    Py_DECREF(item);
    return r;
}

/* dict.pop(key) for a dict, without the KeyError: its value (a new reference), or NULL,
 * with an error set only if one happened (not for a missing key). One lookup where a get
 * and a del take two. */
static inline PyObject *dict_pop(PyObject *dict, PyObject *key) {
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *value = NULL;
    return PyDict_Pop(dict, key, &value) < 0 ? NULL : value;
#else
    PyObject *value = _PyDict_Pop(dict, key, NULL);
    if (value == NULL && PyErr_ExceptionMatches(PyExc_KeyError))
        PyErr_Clear();
    return value;
#endif
}

/* The end of _refill_credit(topic, out, bound_only=True) (credit.py) once its first
 * test let it through, when it would grant nothing and change nothing: every
 * publisher of the topic is unsettled and still holds more than half its window
 * (``(window - credit) * 2 < window``, the loop's first ``continue``). The byte budget
 * can only shrink the window, which keeps that test true, and _byte_limits changes
 * state only when other topics wait for the router's room (``starved`` non-empty) or
 * when no unsettled publisher holds credit: both leave it to the Python method.
 * ``window`` is the count window (the in-flight bound shared out, capped by the
 * publisher window). 1: nothing to do; 0: the Python method decides. */
static int grants_nothing(PyObject *publishers, PyObject *starved, long long window, PyTypeObject *publisher_type,
                          Py_ssize_t credit_offset, Py_ssize_t presettled_offset) {
    if (starved == NULL || !PyDict_CheckExact(starved) || PyDict_GET_SIZE(starved) != 0 || publishers == NULL ||
        !PyDict_CheckExact(publishers) || PyDict_GET_SIZE(publishers) == 0)
        return 0;
    Py_ssize_t pos = 0;
    PyObject *key, *pub;
    while (PyDict_Next(publishers, &pos, &key, &pub)) {
        if (!Py_IS_TYPE(pub, publisher_type) || SLOT(pub, presettled_offset) != Py_False)
            return 0;
        PyObject *credit = SLOT(pub, credit_offset);
        if (credit == NULL || !PyLong_CheckExact(credit))
            return 0;
        int overflow;
        long long c = PyLong_AsLongLongAndOverflow(credit, &overflow);
        if (overflow || (window - c) * 2 >= window)
            return 0;
    }
    return 1;
}

#define INTERN(var, text)                                      \
    do {                                                       \
        if ((var = PyUnicode_InternFromString(text)) == NULL)  \
            return NULL;                                       \
    } while (0)

#endif
