/* The event log's buffer of encoded lines waiting for flush() (router/eventlog.py), as a
 * C type the compiled log_line appends to in place.
 *
 * With an io.BytesIO there, each line the compiled path wrote was a bytes object made
 * for one call of BytesIO.write (its method call, the argument's buffer taken and
 * released, the object freed): ~0.7 k instructions a line, two lines a message at K=1.
 * Here log_line reserves room and copies the line's pieces in; Python code (EventLog's
 * own lines) calls write() as it called BytesIO's.
 *
 * It offers what EventLog uses of a BytesIO, with the same meaning: write(b) -> n,
 * tell(), seek(0) (the lines taken: written again from the start), getbuffer() (a
 * memoryview of the bytes written so far, which holds the buffer: while one is alive
 * a write raises BufferError, as BytesIO's does, so the bytes a flush is writing cannot
 * move), and getvalue(). Its memory stays allocated at the size of the largest batch so
 * far, as the BytesIO's did. */

#ifndef EOROUTER_LOGBUFFER_H
#define EOROUTER_LOGBUFFER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "_jsonfields.h" /* json_buf, json_reserve */

typedef struct {
    PyObject_HEAD
    json_buf buf;       /* the bytes written: buf.data[0:buf.len] */
    Py_ssize_t exports; /* memoryviews alive over them */
} LogBuffer;

static PyTypeObject LogBufferType;

/* Room for n more bytes at buf.data + buf.len: 0, or -1 with BufferError (exported)
 * or MemoryError set. */
static int logbuffer_reserve(LogBuffer *b, Py_ssize_t n)
{
    if (b->exports > 0) {
        PyErr_SetString(PyExc_BufferError, "Existing exports of data: object cannot be re-sized");
        return -1;
    }
    return json_reserve(&b->buf, n);
}

static PyObject *logbuffer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) || (kwargs && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "LogBuffer() takes no arguments");
        return NULL;
    }
    LogBuffer *b = (LogBuffer *)type->tp_alloc(type, 0);
    if (b && logbuffer_reserve(b, 1) < 0) /* data is never NULL: a view of nothing has an address */
        Py_CLEAR(b);
    return (PyObject *)b;
}

static void logbuffer_dealloc(LogBuffer *b)
{
    PyMem_Free(b->buf.data);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static PyObject *logbuffer_write(LogBuffer *b, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_CONTIG_RO) < 0)
        return NULL;
    PyObject *result = NULL;
    if (logbuffer_reserve(b, view.len) == 0) {
        memcpy(b->buf.data + b->buf.len, view.buf, (size_t)view.len);
        b->buf.len += view.len;
        result = PyLong_FromSsize_t(view.len);
    }
    PyBuffer_Release(&view);
    return result;
}

static PyObject *logbuffer_tell(LogBuffer *b, PyObject *unused)
{
    return PyLong_FromSsize_t(b->buf.len);
}

/* seek(pos): only back to a place already written (EventLog rewinds to 0): what follows
 * it is dropped, as the next writes would overwrite it in a BytesIO. */
static PyObject *logbuffer_seek(LogBuffer *b, PyObject *arg)
{
    Py_ssize_t pos = PyLong_AsSsize_t(arg);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    if (pos < 0 || pos > b->buf.len) {
        PyErr_Format(PyExc_ValueError, "LogBuffer.seek(%zd): only back to 0..%zd", pos, b->buf.len);
        return NULL;
    }
    if (b->exports > 0) {
        PyErr_SetString(PyExc_BufferError, "Existing exports of data: object cannot be re-sized");
        return NULL;
    }
    b->buf.len = pos;
    return PyLong_FromSsize_t(pos);
}

static PyObject *logbuffer_getbuffer(LogBuffer *b, PyObject *unused)
{
    return PyMemoryView_FromObject((PyObject *)b);
}

static PyObject *logbuffer_getvalue(LogBuffer *b, PyObject *unused)
{
    return PyBytes_FromStringAndSize(b->buf.data, b->buf.len);
}

static int logbuffer_export(LogBuffer *b, Py_buffer *view, int flags)
{
    if (PyBuffer_FillInfo(view, (PyObject *)b, b->buf.data, b->buf.len, 1, flags) < 0)
        return -1;
    b->exports++;
    return 0;
}

static void logbuffer_release(LogBuffer *b, Py_buffer *view)
{
    b->exports--;
}

static PyMethodDef logbuffer_methods[] = {
    {"write", (PyCFunction)logbuffer_write, METH_O, "write(b) -> int: append the bytes of b."},
    {"tell", (PyCFunction)logbuffer_tell, METH_NOARGS, "tell() -> int: the bytes written."},
    {"seek", (PyCFunction)logbuffer_seek, METH_O, "seek(pos) -> int: back to pos (0..tell()), dropping what follows."},
    {"getbuffer", (PyCFunction)logbuffer_getbuffer, METH_NOARGS,
     "getbuffer() -> memoryview of the bytes written (no write while it is alive)."},
    {"getvalue", (PyCFunction)logbuffer_getvalue, METH_NOARGS, "getvalue() -> bytes: the bytes written."},
    {NULL, NULL, 0, NULL},
};

static PyBufferProcs logbuffer_as_buffer = {
    (getbufferproc)logbuffer_export,
    (releasebufferproc)logbuffer_release,
};

static PyTypeObject LogBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "router.adapter._fastpath.LogBuffer",
    .tp_basicsize = sizeof(LogBuffer),
    .tp_dealloc = (destructor)logbuffer_dealloc,
    .tp_as_buffer = &logbuffer_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The event log's buffer of lines waiting for flush(), appended to in place by log_line.",
    .tp_methods = logbuffer_methods,
    .tp_new = logbuffer_new,
};

/* The LogBuffer whose bound write method ``write`` is (borrowed), or NULL. */
static inline LogBuffer *logbuffer_of_write(PyObject *write)
{
    if (!PyCFunction_Check(write))
        return NULL;
    PyObject *owner = PyCFunction_GET_SELF(write);
    return owner && Py_TYPE(owner) == &LogBufferType ? (LogBuffer *)owner : NULL;
}

#endif
