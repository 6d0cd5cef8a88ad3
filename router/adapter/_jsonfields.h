/* A log line's fields as JSON, in C, for the values the hot lines carry: what
 * orjson.dumps(fields) gives (router/eventlog.py's encoder), byte for byte, without
 * its per-call setup and without a bytes object for the body.
 *
 * Only the plainest shapes are encoded here: a dict whose keys are str; values that are
 * str, int (64-bit), bool, None, or a list or tuple of those; strings ASCII with nothing
 * to escape (delivery ids, tags in hex, container ids and link names as clients usually
 * name them). Anything else (a float, a nested dict or list, a string with a quote, a
 * backslash, a control character or a non-ASCII character, a subclass of any of these,
 * an int past 64 bits) answers "not mine" and the caller asks orjson for the whole
 * line, so the bytes never depend on which encoder wrote them
 * (tests/unit/test_compiled_jsonfields.py holds the two to the same bytes). */

#ifndef EOROUTER_JSONFIELDS_H
#define EOROUTER_JSONFIELDS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} json_buf;

/* Room for n more bytes: 0, or -1 with MemoryError set. */
static int json_reserve(json_buf *b, Py_ssize_t n)
{
    if (b->len + n <= b->cap)
        return 0;
    if (n > PY_SSIZE_T_MAX / 2 - b->len) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n)
        cap *= 2;
    char *data = PyMem_Realloc(b->data, (size_t)cap);
    if (!data) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

/* Whether any of 8 ASCII bytes (each below 0x80) would be escaped: below 0x20, a quote
 * or a backslash. Eight at a time with word arithmetic (a byte-by-byte loop cost ~10
 * instructions a byte, most of the line's encoding): x - 0x01.. & ~x & 0x80.. is nonzero
 * exactly when some byte of x is zero, and x - n*0x01.. & ~x & 0x80.. when some byte
 * is below n (n <= 0x80). */
static inline int json_escapes8(uint64_t v)
{
    const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
    uint64_t quote = v ^ (ones * '"'), backslash = v ^ (ones * '\\');
    return (((v - ones * 0x20) & ~v) | ((quote - ones) & ~quote) | ((backslash - ones) & ~backslash)) & high ? 1 : 0;
}

/* Strings met again and again (the fields' names, a publisher's container and link
 * names, its topic, subscribers' keys, outcomes) are kept encoded, by the identity of
 * the str object: an entry holds its string, so the address cannot be another
 * string's while it is there, and a str does not change. Direct-mapped; a string
 * seen once (a delivery id) only takes a slot until another string needs it. */
#define JSON_STR_CACHE 512
#define JSON_STR_CACHED 56 /* the longest encoding kept (quotes included) */

typedef struct {
    PyObject *s; /* held */
    Py_ssize_t len;
    char encoded[JSON_STR_CACHED];
} json_str_entry;

static json_str_entry json_str_cache[JSON_STR_CACHE];

/* A str as a JSON string: 1 written, 0 not mine (nothing written), -1 error. A string
 * met before comes from its cache entry in one fixed-size copy; a new one is checked and
 * copied in the same pass, eight bytes at a time (a copy and a scan per string through
 * libc cost more than the work itself: the strings are short). */
static int json_str_new(json_buf *b, PyObject *s, json_str_entry *e);

static inline int json_str(json_buf *b, PyObject *s)
{
    uintptr_t at = (uintptr_t)s;
    json_str_entry *e = &json_str_cache[((at >> 4) ^ (at >> 13)) & (JSON_STR_CACHE - 1)];
    if (e->s != s)
        return json_str_new(b, s, e);
    if (b->len + JSON_STR_CACHED > b->cap && json_reserve(b, JSON_STR_CACHED) < 0)
        return -1;
    memcpy(b->data + b->len, e->encoded, JSON_STR_CACHED); /* a fixed size: a few moves */
    b->len += e->len;
    return 1;
}

/* json_str for a string not in its cache entry ``e`` (which it then takes). */
static int json_str_new(json_buf *b, PyObject *s, json_str_entry *e)
{
    if (!PyUnicode_CheckExact(s) || !PyUnicode_IS_COMPACT_ASCII(s))
        return 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s), i = 0;
    if (json_reserve(b, n + 2 + 8) < 0) /* (+8: whole words stored past the end) */
        return -1;
    const unsigned char *p = PyUnicode_1BYTE_DATA(s);
    char *start = b->data + b->len, *o = start + 1;
    uint64_t word;
    for (; i + 8 <= n; i += 8) {
        memcpy(&word, p + i, 8);
        if (json_escapes8(word))
            return 0;
        memcpy(o + i, &word, 8);
    }
    if (i < n) {
        word = 0x6161616161616161ULL; /* the tail padded with 'a', which needs no escape */
        memcpy(&word, p + i, (size_t)(n - i));
        if (json_escapes8(word))
            return 0;
        memcpy(o + i, &word, 8);
    }
    o[-1] = '"';
    o[n] = '"';
    b->len += n + 2;
    if (n + 2 <= JSON_STR_CACHED) {
        PyObject *old = e->s;
        e->s = Py_NewRef(s);
        e->len = n + 2;
        memcpy(e->encoded, start, (size_t)(n + 2));
        Py_XDECREF(old); /* (last: freeing it runs no Python code, but keep the entry whole first) */
    }
    return 1;
}

/* n in decimal at o (room for 20 digits and a sign), as "%lld" writes it: its length.
 * (snprintf's parsing of its format cost ~600 instructions a number.) */
static inline int json_decimal(char *o, long long n)
{
    unsigned long long v = n < 0 ? 0ULL - (unsigned long long)n : (unsigned long long)n;
    char digits[20];
    int nd = 0, len = 0;
    do {
        digits[nd++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    if (n < 0)
        o[len++] = '-';
    while (nd)
        o[len++] = digits[--nd];
    return len;
}

/* A scalar (str, int, bool, None): 1, 0 not mine, -1 error. */
static int json_scalar(json_buf *b, PyObject *v)
{
    if (PyUnicode_CheckExact(v))
        return json_str(b, v);
    if (v == Py_None || v == Py_True || v == Py_False) {
        const char *word = v == Py_None ? "null" : v == Py_True ? "true" : "false";
        Py_ssize_t n = (Py_ssize_t)strlen(word);
        if (json_reserve(b, n) < 0)
            return -1;
        memcpy(b->data + b->len, word, (size_t)n);
        b->len += n;
        return 1;
    }
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow)
            return 0;
        if (x == -1 && PyErr_Occurred())
            return -1;
        if (json_reserve(b, 21) < 0)
            return -1;
        b->len += json_decimal(b->data + b->len, x);
        return 1;
    }
    return 0;
}

/* A value: a scalar, or a list or tuple of scalars. 1, 0 not mine, -1 error. */
static int json_value(json_buf *b, PyObject *v)
{
    if (!PyList_CheckExact(v) && !PyTuple_CheckExact(v))
        return json_scalar(b, v);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
    PyObject **items = PySequence_Fast_ITEMS(v);
    if (json_reserve(b, 1) < 0)
        return -1;
    b->data[b->len++] = '[';
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i) {
            if (json_reserve(b, 1) < 0)
                return -1;
            b->data[b->len++] = ',';
        }
        int r = json_scalar(b, items[i]);
        if (r <= 0)
            return r;
    }
    if (json_reserve(b, 1) < 0)
        return -1;
    b->data[b->len++] = ']';
    return 1;
}

/* orjson.dumps(fields) into b (from b->len on): 1 written, 0 not mine (b->len as it
 * was; the caller encodes the line another way), -1 error set. */
static int json_fields(json_buf *b, PyObject *fields)
{
    if (!PyDict_CheckExact(fields))
        return 0;
    Py_ssize_t start = b->len, pos = 0;
    PyObject *key, *value;
    int r = json_reserve(b, 2);
    if (r < 0)
        return -1;
    b->data[b->len++] = '{';
    int first = 1;
    while (PyDict_Next(fields, &pos, &key, &value)) {
        if (!first) {
            if (json_reserve(b, 1) < 0)
                goto failed;
            b->data[b->len++] = ',';
        }
        first = 0;
        if (!PyUnicode_CheckExact(key))
            goto not_mine;
        r = json_str(b, key);
        if (r <= 0)
            goto result;
        if (json_reserve(b, 1) < 0)
            goto failed;
        b->data[b->len++] = ':';
        r = json_value(b, value);
        if (r <= 0)
            goto result;
    }
    if (json_reserve(b, 1) < 0)
        goto failed;
    b->data[b->len++] = '}';
    return 1;
not_mine:
    r = 0;
result:
    b->len = start;
    return r;
failed:
    b->len = start;
    return -1;
}

#endif
