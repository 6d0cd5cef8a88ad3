/* The compiled twin of router/core/msgfields.py's python_application_properties:
 * the application properties a router's selectors read, from the encoded message.
 *
 * msgfields.py is the specification; this only makes the usual case fast. It
 * walks the sections as selector_env does (headers off) and reads the
 * application-properties map, making a Python object only for the properties
 * named. Whatever it is not sure to read exactly as the specification does (a
 * descriptor other than a small ulong, a described, compound or unknown value,
 * a key that is not a string, anything running past its map or the message) it
 * does not read at all: read returns None, and application_properties (what the
 * core calls) hands the message to the Python reader.
 * tests/unit/test_msgfields_compiled.py checks the two agree on generated
 * messages, malformed ones included.
 *
 * Optional: without it (no C compiler at install) the core reads in Python.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define APP_PROPERTIES 0x74

static uint32_t u32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static uint64_t u64(const unsigned char *p) {
    return ((uint64_t)u32(p) << 32) | (uint64_t)u32(p + 4);
}

/* Where the section value at p[i] ends, as msgfields._skip says (-1: not sure: let
 * Python read the message). Like _skip it does not check a sized value's end
 * against the message: the caller's loop stops there. */
static Py_ssize_t skip_section(const unsigned char *p, Py_ssize_t n, Py_ssize_t i) {
    switch (p[i]) {
    case 0xC0: case 0xC1: case 0xE0: case 0xA0: case 0xA1: case 0xA3:
        return i + 2 > n ? -1 : i + 2 + p[i + 1];
    case 0xD0: case 0xD1: case 0xF0: case 0xB0: case 0xB1: case 0xB3:
        return i + 5 > n ? -1 : i + 5 + (Py_ssize_t)u32(p + i + 1);
    case 0x40: case 0x45:
        return i + 1;
    default:
        return -1;
    }
}

/* The width after the constructor of a fixed-width simple value (-1: not one). */
static int fixed_width(unsigned char code) {
    switch (code) {
    case 0x40: case 0x41: case 0x42: case 0x43: case 0x44: case 0x45:
        return 0;
    case 0x50: case 0x51: case 0x52: case 0x53: case 0x54: case 0x55: case 0x56:
        return 1;
    case 0x60: case 0x61:
        return 2;
    case 0x70: case 0x71: case 0x72: case 0x73: case 0x74:
        return 4;
    case 0x80: case 0x81: case 0x82: case 0x83: case 0x84:
        return 8;
    case 0x94: case 0x98:
        return 16;
    default:
        return -1;
    }
}

/* The value a selector sees of the fixed-width value at p (its constructor), as
 * msgfields._value then _simple make it. New reference; NULL on a Python error. */
static PyObject *fixed_value(const unsigned char *p) {
    const unsigned char *v = p + 1;
    switch (p[0]) {
    case 0x41: Py_RETURN_TRUE;
    case 0x42: Py_RETURN_FALSE;
    case 0x43: case 0x44: return PyLong_FromLong(0);
    case 0x50: case 0x52: case 0x53: return PyLong_FromLong(v[0]);
    case 0x51: case 0x54: case 0x55: return PyLong_FromLong((signed char)v[0]);
    case 0x56: return PyBool_FromLong(v[0] != 0);
    case 0x60: return PyLong_FromLong((v[0] << 8) | v[1]);
    case 0x61: return PyLong_FromLong((int16_t)((v[0] << 8) | v[1]));
    case 0x70: return PyLong_FromUnsignedLong(u32(v));
    case 0x71: return PyLong_FromLong((int32_t)u32(v));
    case 0x72: {
        uint32_t bits = u32(v);
        float f;
        memcpy(&f, &bits, 4);
        return PyFloat_FromDouble((double)f);
    }
    case 0x80: return PyLong_FromUnsignedLongLong(u64(v));
    case 0x81: case 0x83: return PyLong_FromLongLong((int64_t)u64(v));
    case 0x82: {
        uint64_t bits = u64(v);
        double d;
        memcpy(&d, &bits, 8);
        return PyFloat_FromDouble(d);
    }
    case 0x73: {
        uint32_t c = u32(v);
        if (c < 0x110000)
            return PyUnicode_FromOrdinal((int)c);
        Py_RETURN_NONE;
    }
    case 0x98: /* a uuid: Python's str(uuid.UUID(bytes=...)) */
        return PyUnicode_FromFormat("%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", v[0], v[1],
                                    v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12], v[13], v[14],
                                    v[15]);
    default: /* null, the empty list, decimals: nothing a selector compares */
        Py_RETURN_NONE;
    }
}

/* A string or symbol's bytes as Python decodes them (UTF-8, errors replaced); ASCII,
 * the usual, copied as it is (less than half the decoder's cost). New reference. */
static PyObject *text(const unsigned char *bytes, Py_ssize_t size) {
    for (Py_ssize_t k = 0; k < size; k++)
        if (bytes[k] >= 0x80)
            return PyUnicode_DecodeUTF8((const char *)bytes, size, "replace");
    PyObject *ascii = PyUnicode_New(size, 127);
    if (ascii != NULL)
        memcpy(PyUnicode_1BYTE_DATA(ascii), bytes, (size_t)size);
    return ascii;
}

/* Which of ``names`` (a tuple of str) the key's UTF-8 bytes name: its index, or -1.
 * A key that is not valid UTF-8 is decoded as Python decodes it (errors replaced)
 * before it is compared. -2: a Python error. */
static Py_ssize_t named(PyObject *names, const unsigned char *key, Py_ssize_t size) {
    Py_ssize_t count = PyTuple_GET_SIZE(names);
    int ascii = 1;
    for (Py_ssize_t k = 0; k < size; k++)
        if (key[k] >= 0x80) {
            ascii = 0;
            break;
        }
    if (ascii) {
        for (Py_ssize_t k = 0; k < count; k++) {
            Py_ssize_t length;
            const char *name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(names, k), &length);
            if (name == NULL)
                return -2;
            if (length == size && memcmp(name, key, (size_t)size) == 0)
                return k;
        }
        return -1;
    }
    PyObject *decoded = PyUnicode_DecodeUTF8((const char *)key, size, "replace");
    if (decoded == NULL)
        return -2;
    Py_ssize_t found = -1;
    for (Py_ssize_t k = 0; k < count && found == -1; k++) {
        int equal = PyUnicode_Compare(decoded, PyTuple_GET_ITEM(names, k));
        if (equal == -1 && PyErr_Occurred())
            found = -2;
        else if (equal == 0)
            found = k;
    }
    Py_DECREF(decoded);
    return found;
}

/* The application-properties map at p[i]: found[k], the value of names[k] (a new
 * reference; the last one when a key repeats), stays NULL when absent. 0: read; 1:
 * not sure (Python reads it); -1: a Python error. */
static int read_map(const unsigned char *p, Py_ssize_t n, Py_ssize_t i, PyObject *names, PyObject **found) {
    Py_ssize_t count, j, end;
    if (i >= n)
        return 1;
    if (p[i] == 0xC1) {
        if (i + 3 > n)
            return 1;
        count = p[i + 2];
        j = i + 3;
        end = i + 2 + p[i + 1];
    } else if (p[i] == 0xD1) {
        if (i + 9 > n)
            return 1;
        count = (Py_ssize_t)u32(p + i + 5);
        j = i + 9;
        end = i + 5 + (Py_ssize_t)u32(p + i + 1);
    } else {
        return 0; /* null, or not a map: no properties (as Python says) */
    }
    if (end > n)
        return 1;
    for (Py_ssize_t pair = 0; pair < count / 2; pair++) {
        /* the key: a string or symbol */
        if (j + 1 > end)
            return 1;
        Py_ssize_t key_size, key_at;
        unsigned char code = p[j];
        if (code == 0xA1 || code == 0xA3) {
            if (j + 2 > end)
                return 1;
            key_size = p[j + 1];
            key_at = j + 2;
        } else if (code == 0xB1 || code == 0xB3) {
            if (j + 5 > end)
                return 1;
            key_size = (Py_ssize_t)u32(p + j + 1);
            key_at = j + 5;
        } else {
            return 1;
        }
        if (key_size > end - key_at)
            return 1;
        j = key_at + key_size;
        /* the value: where it is and how long */
        if (j + 1 > end)
            return 1;
        code = p[j];
        Py_ssize_t value_at = j, value_end;
        int width = fixed_width(code);
        if (width >= 0) {
            value_end = j + 1 + width;
        } else if (code == 0xA0 || code == 0xA1 || code == 0xA3) {
            if (j + 2 > end)
                return 1;
            value_end = j + 2 + p[j + 1];
        } else if (code == 0xB0 || code == 0xB1 || code == 0xB3) {
            if (j + 5 > end)
                return 1;
            value_end = j + 5 + (Py_ssize_t)u32(p + j + 1);
            if (value_end < j) /* (a size past what a signed size holds) */
                return 1;
        } else {
            return 1; /* described, compound or unknown */
        }
        if (value_end > end)
            return 1;
        j = value_end;
        Py_ssize_t which = named(names, p + key_at, key_size);
        if (which == -2)
            return -1;
        if (which < 0)
            continue;
        PyObject *value;
        if (width >= 0) {
            value = fixed_value(p + value_at);
        } else if (code == 0xA0 || code == 0xB0) {
            value = Py_NewRef(Py_None); /* binary */
        } else {
            Py_ssize_t head = code >= 0xB0 ? 5 : 2;
            value = text(p + value_at + head, value_end - value_at - head);
        }
        if (value == NULL)
            return -1;
        Py_XSETREF(found[which], value);
    }
    return 0;
}

#define MAX_NAMES 64 /* (more names than a router's selectors read: Python reads them) */
#define AS_DICT 0
#define AS_TUPLE 1

/* The properties ``names`` names as a dict (absent: not in it) or a tuple (absent:
 * None); Py_None when not sure; NULL on a Python error. */
static PyObject *read_properties(PyObject *const *args, Py_ssize_t nargs, int shape) {
    if (nargs != 2 || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "(payload, names): names is a tuple of str");
        return NULL;
    }
    PyObject *names = args[1];
    Py_ssize_t count = PyTuple_GET_SIZE(names);
    for (Py_ssize_t k = 0; k < count; k++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(names, k))) {
            PyErr_SetString(PyExc_TypeError, "(payload, names): names is a tuple of str");
            return NULL;
        }
    if (count > MAX_NAMES)
        Py_RETURN_NONE;
    Py_buffer view = {0};
    const unsigned char *p;
    Py_ssize_t n;
    if (PyBytes_CheckExact(args[0])) { /* the usual payload: no buffer to take (~500 instructions less) */
        p = (const unsigned char *)PyBytes_AS_STRING(args[0]);
        n = PyBytes_GET_SIZE(args[0]);
    } else {
        if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
            return NULL;
        p = view.buf;
        n = view.len;
    }
    PyObject *found[MAX_NAMES] = {NULL};
    int outcome = 0;
    Py_ssize_t i = 0;
    while (i + 2 < n && p[i] == 0x00) {
        if (p[i + 1] != 0x53) { /* a descriptor other than a small ulong */
            outcome = 1;
            break;
        }
        unsigned char code = p[i + 2];
        if (code > APP_PROPERTIES)
            break; /* the body (or a footer) */
        if (code == APP_PROPERTIES) {
            outcome = read_map(p, n, i + 3, names, found);
            break;
        }
        if (i + 3 >= n)
            break; /* (Python's IndexError: nothing more read) */
        i = skip_section(p, n, i + 3);
        if (i < 0) {
            outcome = 1;
            break;
        }
    }
    if (view.obj != NULL)
        PyBuffer_Release(&view);
    PyObject *result = NULL;
    if (outcome == 0 && shape == AS_TUPLE) {
        result = PyTuple_New(count);
        for (Py_ssize_t k = 0; result != NULL && k < count; k++) {
            PyTuple_SET_ITEM(result, k, found[k] != NULL ? found[k] : Py_NewRef(Py_None));
            found[k] = NULL; /* (the tuple has it) */
        }
    } else if (outcome == 0) {
        result = PyDict_New();
        for (Py_ssize_t k = 0; result != NULL && k < count; k++)
            if (found[k] != NULL && PyDict_SetItem(result, PyTuple_GET_ITEM(names, k), found[k]) < 0)
                Py_CLEAR(result);
    } else if (outcome == 1) {
        result = Py_NewRef(Py_None);
    }
    for (Py_ssize_t k = 0; k < count; k++)
        Py_XDECREF(found[k]);
    return result;
}

PyDoc_STRVAR(read_doc,
             "read(payload, names) -> dict | None\n\n"
             "The application properties ``names`` (a tuple of str) names, of the encoded message\n"
             "``payload``, as msgfields.python_application_properties reads them; None when this\n"
             "reader is not sure to read them exactly as it does.");

static PyObject *read_dict(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return read_properties(args, nargs, AS_DICT);
}

PyDoc_STRVAR(read_values_doc,
             "read_values(payload, names) -> tuple | None\n\n"
             "read's properties as a tuple in the order of ``names`` (None for an absent one), as\n"
             "msgfields.python_application_values reads them; None when not sure.");

static PyObject *read_tuple(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return read_properties(args, nargs, AS_TUPLE);
}

/* msgfields.python_application_properties and python_application_values, once bound */
static PyObject *python_reader = NULL, *python_values_reader = NULL;

PyDoc_STRVAR(bind_doc,
             "bind(python_reader, python_values_reader): the readers application_properties and\n"
             "application_values leave a message to when read or read_values declines it.");

static PyObject *bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "bind(python_reader, python_values_reader): two functions");
        return NULL;
    }
    Py_XSETREF(python_reader, Py_NewRef(args[0]));
    Py_XSETREF(python_values_reader, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* read_properties, or the bound Python reader's answer when it declines (one call from
 * Python either way: the usual message costs no Python frame). */
static PyObject *read_or_leave(PyObject *const *args, Py_ssize_t nargs, int shape) {
    PyObject *answer = read_properties(args, nargs, shape);
    if (answer != Py_None)
        return answer; /* (or NULL: an error) */
    Py_DECREF(answer);
    PyObject *reader = shape == AS_TUPLE ? python_values_reader : python_reader;
    if (reader == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "no Python reader bound");
        return NULL;
    }
    return PyObject_Vectorcall(reader, args, (size_t)nargs, NULL);
}

PyDoc_STRVAR(application_properties_doc,
             "application_properties(payload, names) -> dict: read's, or the Python reader's.");

static PyObject *application_properties(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return read_or_leave(args, nargs, AS_DICT);
}

PyDoc_STRVAR(application_values_doc,
             "application_values(payload, names) -> tuple: read_values's, or the Python reader's.");

static PyObject *application_values(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return read_or_leave(args, nargs, AS_TUPLE);
}

static PyMethodDef methods[] = {
    {"read", (PyCFunction)(void (*)(void))read_dict, METH_FASTCALL, read_doc},
    {"read_values", (PyCFunction)(void (*)(void))read_tuple, METH_FASTCALL, read_values_doc},
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL, bind_doc},
    {"application_properties", (PyCFunction)(void (*)(void))application_properties, METH_FASTCALL,
     application_properties_doc},
    {"application_values", (PyCFunction)(void (*)(void))application_values, METH_FASTCALL, application_values_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "router.core._msgfields",
    "The compiled twin of msgfields.application_properties (router/core/_msgfields.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__msgfields(void) {
    return PyModule_Create(&module);
}
