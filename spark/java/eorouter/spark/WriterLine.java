package eorouter.spark;

import com.fasterxml.jackson.core.io.NumberInput;
import java.nio.charset.StandardCharsets;

/**
 * The event log writer's own shape of a JSON line, parsed without Jackson: one object of
 * {@code "name":value} pairs with no whitespace, names and strings of printable ASCII without
 * escapes, numbers in JSON's grammar, {@code null}, {@code true}, {@code false}, and arrays of such
 * strings. That is every line router/eventlog.py and the clients' ledgers write, and parsing it
 * here costs a fraction of Jackson's tokens, parser objects and field-name lookups (docs/reconcile.md,
 * "Speed").
 *
 * <p>It parses only what it can parse exactly as Jackson would: anything else (whitespace,
 * escapes, bytes outside ASCII, nested objects, a number Jackson might read otherwise, a field
 * twice, a name in another letter case than the schema's) makes it decline, and the line is parsed
 * by Jackson as before ({@link LineScan.Scanner#parse}). So a declined line costs one extra look,
 * and a line it takes is one Jackson takes to the same values (tests/spark/test_line_scan.py
 * compares the two on generated lines).
 */
final class WriterLine {
    /** Longest number text it reads: far below Jackson's limit (StreamReadConstraints, 1000). */
    private static final int MAX_NUMBER = 64;
    /** Longest name or string: far below Jackson's limits (50,000 and 20,000,000). */
    private static final int MAX_TEXT = 1 << 16;
    /** A name the schema does not have: skipped, as Jackson's path skips it. */
    private static final int IGNORED = -1;
    /** A schema's name in another letter case: Jackson's path decides (it declines the line). */
    private static final int OTHER_CASE = -2;

    private final LineScan.Spec s;
    private final LineScan.Line line;
    private final Names names;
    private char[] chars = new char[MAX_NUMBER];
    /** Where the last value parsed ended (the next byte's place). */
    private int at;

    WriterLine(LineScan.Spec s, LineScan.Line line) {
        this.s = s;
        this.line = line;
        this.names = new Names(s);
    }

    /**
     * Parses bytes[start, end), which start with '{', into the line (whose generation the caller
     * has just advanced). False: not the writer's plain shape; the line's fields are then
     * undefined, and the caller parses it again with Jackson under a new generation.
     */
    boolean parse(byte[] b, int start, int end) {
        LineScan.Line l = line;
        int i = start + 1;
        if (i >= end || b[i] == '}') return false; // (an empty object: Jackson's path says why)
        while (true) {
            if (b[i] != '"') return false;
            int from = i + 1;
            i = text(b, from, end);
            if (i < 0 || i + 1 >= end || b[i + 1] != ':') return false;
            int code = names.code(b, from, i - from);
            i += 2;
            if (i >= end) return false;
            if (code < 0) {
                if (code == OTHER_CASE || !skip(b, i, end)) return false;
            } else {
                if (l.seen[code] == l.generation) return false;
                l.seen[code] = l.generation;
                l.objects[code] = null;
                if (!value(b, i, end, code)) return false;
            }
            i = at;
            if (i >= end) return false;
            byte c = b[i];
            if (c == '}') return i + 1 == end;
            if (c != ',' || ++i >= end) return false;
        }
    }

    /** A field's value at b[i] into the line, by the schema's type; false: not read here. */
    private boolean value(byte[] b, int i, int end, int f) {
        LineScan.Line l = line;
        byte c = b[i];
        if (c == 'n') return literal(b, i, end, "null");
        switch (s.types[f]) {
            case LineScan.LONG: {
                long v = integer(b, i, end);
                if (v == Long.MIN_VALUE) return false;
                l.longs[f] = v;
                l.objects[f] = Boolean.TRUE;
                return true;
            }
            case LineScan.DOUBLE: {
                if (!number(b, i, end)) return false;
                l.doubles[f] = toDouble(b, i, at);
                l.objects[f] = Boolean.TRUE;
                return true;
            }
            case LineScan.STRING: {
                if (c != '"') return false;
                int close = text(b, i + 1, end);
                if (close < 0) return false;
                l.objects[f] = new String(b, i + 1, close - i - 1, StandardCharsets.ISO_8859_1);
                at = close + 1;
                return true;
            }
            case LineScan.BOOLEAN:
                if (c == 't' && literal(b, i, end, "true")) l.objects[f] = Boolean.TRUE;
                else if (c == 'f' && literal(b, i, end, "false")) l.objects[f] = Boolean.FALSE;
                else return false;
                return true;
            default: {
                if (c != '[') return false;
                int n = strings(b, i, end, null);
                if (n < 0) return false;
                String[] items = new String[n];
                strings(b, i, end, items);
                l.objects[f] = items;
                return true;
            }
        }
    }

    /**
     * The strings of an array at b[i] (which is '['): how many (-1: not an array of plain strings);
     * with ``into``, they are made into it. Ends with ``at`` after the ']'.
     */
    private int strings(byte[] b, int i, int end, String[] into) {
        i++;
        if (i < end && b[i] == ']') {
            at = i + 1;
            return 0;
        }
        int n = 0;
        while (i < end && b[i] == '"') {
            int close = text(b, i + 1, end);
            if (close < 0 || close + 1 >= end) return -1;
            if (into != null) into[n] = new String(b, i + 1, close - i - 1, StandardCharsets.ISO_8859_1);
            n++;
            byte c = b[close + 1];
            if (c == ']') {
                at = close + 2;
                return n;
            }
            if (c != ',') return -1;
            i = close + 2;
        }
        return -1;
    }

    /** Skips a value of a field the schema lacks, checking it as Jackson would; false: not here. */
    private boolean skip(byte[] b, int i, int end) {
        byte c = b[i];
        switch (c) {
            case '"': {
                int close = text(b, i + 1, end);
                at = close + 1;
                return close >= 0;
            }
            case 'n': return literal(b, i, end, "null");
            case 't': return literal(b, i, end, "true");
            case 'f': return literal(b, i, end, "false");
            case '[': {
                i++;
                if (i < end && b[i] == ']') {
                    at = i + 1;
                    return true;
                }
                while (i < end) {
                    c = b[i];
                    if (c == '[' || c == '{' || !skip(b, i, end)) return false;
                    i = at;
                    if (i >= end) return false;
                    if (b[i] == ']') {
                        at = i + 1;
                        return true;
                    }
                    if (b[i] != ',') return false;
                    i++;
                }
                return false;
            }
            default: return number(b, i, end);
        }
    }

    /** The closing quote of a plain string starting at b[i] (after its opening quote), or -1. */
    private static int text(byte[] b, int i, int end) {
        int limit = Math.min(end, i + MAX_TEXT);
        for (; i < limit; i++) {
            byte c = b[i];
            if (c == '"') return i;
            // (bytes are signed: one >= 0x80, not ASCII, is below 0x20 here too)
            if (c < 0x20 || c == '\\') return -1;
        }
        return -1;
    }

    private boolean literal(byte[] b, int i, int end, String word) {
        int n = word.length();
        if (end - i < n) return false;
        for (int k = 0; k < n; k++) if (b[i + k] != word.charAt(k)) return false;
        at = i + n;
        return true;
    }

    /**
     * A JSON number at b[i], ``-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?``, followed by a byte
     * that may follow a value; ``at`` after it. False: not one (or longer than MAX_NUMBER).
     */
    private boolean number(byte[] b, int i, int end) {
        int start = i;
        if (i < end && b[i] == '-') i++;
        if (i >= end) return false;
        if (b[i] == '0') i++;
        else {
            int d = i;
            while (i < end && b[i] >= '0' && b[i] <= '9') i++;
            if (i == d || b[d] == '0') return false;
        }
        if (i < end && b[i] == '.') {
            int d = ++i;
            while (i < end && b[i] >= '0' && b[i] <= '9') i++;
            if (i == d) return false;
        }
        if (i < end && (b[i] == 'e' || b[i] == 'E')) {
            i++;
            if (i < end && (b[i] == '+' || b[i] == '-')) i++;
            int d = i;
            while (i < end && b[i] >= '0' && b[i] <= '9') i++;
            if (i == d) return false;
        }
        if (i - start > MAX_NUMBER || i >= end) return false;
        byte c = b[i];
        if (c != ',' && c != '}' && c != ']') return false;
        at = i;
        return true;
    }

    /**
     * An integer of at most 18 digits (always a long, as Jackson reads it) at b[i]; Long.MIN_VALUE:
     * not one (a fraction or exponent, more digits, not a number).
     */
    private long integer(byte[] b, int i, int end) {
        if (!number(b, i, end)) return Long.MIN_VALUE;
        int stop = at;
        boolean negative = b[i] == '-';
        if (negative) i++;
        if (stop - i > 18) return Long.MIN_VALUE;
        long v = 0;
        for (; i < stop; i++) {
            byte c = b[i];
            if (c < '0' || c > '9') return Long.MIN_VALUE; // '.', 'e': a float, Jackson's path says why
            v = v * 10 + (c - '0');
        }
        return negative ? -v : v;
    }

    /** The double a checked number b[from, to) is, as Jackson's getDoubleValue gives it. */
    private double toDouble(byte[] b, int from, int to) {
        boolean integral = true;
        for (int k = from; k < to; k++) {
            byte c = b[k];
            if (c == '.' || c == 'e' || c == 'E') {
                integral = false;
                break;
            }
        }
        int digits = to - from - (b[from] == '-' ? 1 : 0);
        if (integral && digits <= 18) {
            // An integer token: Jackson reads it as an int or long and converts that to double.
            // (-0 is the long 0: 0.0, not -0.0)
            long v = 0;
            for (int k = b[from] == '-' ? from + 1 : from; k < to; k++) v = v * 10 + (b[k] - '0');
            return (double) (b[from] == '-' ? -v : v);
        }
        char[] c = chars;
        int n = to - from;
        for (int k = 0; k < n; k++) c[k] = (char) b[from + k];
        // Correctly rounded, as Double.parseDouble is (Jackson's bundled FastDoubleParser).
        return NumberInput.parseDouble(c, 0, n, true);
    }

    /** Field names to the schema's places, by their bytes: no String made for a name seen before. */
    static final class Names {
        private static final int SIZE = 512; // slots (a power of two), filled at most half
        private final LineScan.Spec s;
        private final byte[][] keys = new byte[SIZE][];
        private final int[] codes = new int[SIZE];
        private int filled;

        Names(LineScan.Spec s) {
            this.s = s;
        }

        int code(byte[] b, int from, int length) {
            int h = 0x811c9dc5;
            for (int k = 0; k < length; k++) h = (h ^ b[from + k]) * 0x01000193;
            int slot = (h ^ (h >>> 15)) & (SIZE - 1);
            while (true) {
                byte[] key = keys[slot];
                if (key == null) break;
                if (key.length == length && same(key, b, from)) return codes[slot];
                slot = (slot + 1) & (SIZE - 1);
            }
            String name = new String(b, from, length, StandardCharsets.ISO_8859_1);
            Integer f = s.fieldIndex.get(name);
            int code = f != null ? f : s.inOtherCase(name) ? OTHER_CASE : IGNORED;
            if (filled < SIZE / 2) { // (past that, a name is looked up each time: still right)
                keys[slot] = java.util.Arrays.copyOfRange(b, from, from + length);
                codes[slot] = code;
                filled++;
            }
            return code;
        }

        private static boolean same(byte[] key, byte[] b, int from) {
            for (int k = 0; k < key.length; k++) if (key[k] != b[from + k]) return false;
            return true;
        }
    }
}
