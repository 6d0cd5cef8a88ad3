/* Attributes of Python objects read and written from C: a slot by its offset (SLOT,
 * set_slot), and getattr/setattr by name with a fast path for plain slots (get_attr,
 * set_attr). Shared by the core's compiled twins (_coreobjects.h) and the adapter's
 * compiled path (router/adapter/_fastpath.c). */

#ifndef EOROUTER_ATTRS_H
#define EOROUTER_ATTRS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <structmember.h>

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

static inline void set_slot(PyObject *o, Py_ssize_t offset, PyObject *value) {
    PyObject *old = SLOT(o, offset);
    Py_INCREF(value);
    SLOT(o, offset) = value;
    Py_XDECREF(old);
}

/* ------------------------------------------------------------------ attributes by name
 *
 * getattr(o, name) and setattr(o, name, value) for the objects the twins read by name
 * (the core, its settings, the engine, the event log: reached from Python objects whose
 * class the twin does not bind), as Python does them, faster when the class keeps that
 * attribute in a plain slot: the slot's offset, found once per (class, name) through
 * the class's attribute lookup and remembered with the class's version tag (a class
 * changed since is looked up again), at the call site and in a cache they share, then
 * read or written directly. Anything else (an
 * attribute in the instance's __dict__, a property, a class with its own
 * __getattribute__ or __setattr__, such as a frozen dataclass's) takes Python's own
 * path. ``name`` must be interned (the twins' names are). */

#define ATTR_CACHE_SIZE 256

typedef struct {
    PyTypeObject *type; /* held: a class freed and another made at its address is never confused */
    PyObject *name;
    unsigned int version;
    Py_ssize_t offset; /* -1: not a plain slot */
} attr_entry;

static attr_entry attr_cache[ATTR_CACHE_SIZE];

/* What entry ``e`` knows from now on, when the class has a valid version tag to check it
 * by (a class without one is looked up every time). */
static void remember(attr_entry *e, PyTypeObject *type, PyObject *name, Py_ssize_t offset) {
    if (type->tp_version_tag == 0 || !(type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG))
        return;
    Py_INCREF(type);
    Py_INCREF(name);
    Py_XDECREF(e->type);
    Py_XDECREF(e->name);
    e->type = type;
    e->name = name;
    e->version = type->tp_version_tag;
    e->offset = offset;
}

static Py_ssize_t slot_offset_of(PyTypeObject *type, PyObject *name) {
    attr_entry *e = &attr_cache[(((uintptr_t)type >> 4) ^ ((uintptr_t)name >> 4)) & (ATTR_CACHE_SIZE - 1)];
    if (e->type == type && e->name == name && e->version == type->tp_version_tag && e->version != 0)
        return e->offset;
    PyObject *descr = _PyType_Lookup(type, name); /* borrowed; sets no error; gives the class a version tag */
    Py_ssize_t offset = -1;
    if (descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
        ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX &&
        !(((PyMemberDescrObject *)descr)->d_member->flags & READONLY))
        offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    remember(e, type, name, offset);
    return offset;
}

/* The offset of name in type through a call site's own entry (the global cache behind
 * it): a hot site reads one class's attribute every time, so its check is a few
 * compares, inlined, with no hashing and no other site's entry to collide with. */
static inline Py_ssize_t site_offset_of(attr_entry *site, PyTypeObject *type, PyObject *name) {
    if (site->type == type && site->name == name && site->version == type->tp_version_tag && site->version != 0)
        return site->offset;
    Py_ssize_t offset = slot_offset_of(type, name);
    remember(site, type, name, offset);
    return offset;
}

/* getattr(o, name): a new reference, or NULL with the error Python raises. */
static inline PyObject *get_attr_at(attr_entry *site, PyObject *o, PyObject *name) {
    PyTypeObject *type = Py_TYPE(o);
    if (type->tp_getattro == PyObject_GenericGetAttr) {
        Py_ssize_t offset = site_offset_of(site, type, name);
        if (offset >= 0) {
            PyObject *value = SLOT(o, offset);
            if (value != NULL)
                return Py_NewRef(value);
        }
    }
    return PyObject_GetAttr(o, name);
}

/* setattr(o, name, value): 0, or -1 with the error Python raises. */
static inline int set_attr_at(attr_entry *site, PyObject *o, PyObject *name, PyObject *value) {
    PyTypeObject *type = Py_TYPE(o);
    if (type->tp_setattro == PyObject_GenericSetAttr) {
        Py_ssize_t offset = site_offset_of(site, type, name);
        if (offset >= 0) {
            set_slot(o, offset, value);
            return 0;
        }
    }
    return PyObject_SetAttr(o, name, value);
}

/* get_attr(o, name), set_attr(o, name, value): the two above, each call site with its
 * own entry (a GNU C statement expression, which GCC and Clang both take). */
#define get_attr(o, name) __extension__({ static attr_entry site_; get_attr_at(&site_, (o), (name)); })
#define set_attr(o, name, value) __extension__({ static attr_entry site_; set_attr_at(&site_, (o), (name), (value)); })

#endif
