package eorouter.spark;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import java.io.IOException;
import java.io.Serializable;
import java.io.StringWriter;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.sql.DataFrameReader;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The proof's first read (spark/reconcile.py, input_facts) as one pass of plain Java over the
 * routers' JSON lines: each line parsed once with Jackson's streaming parser, checked, and folded
 * into per-partition facts (sequence bits per router and epoch, event counts per kind, the routers
 * events name, the lines that name no delivery), which the driver merges.
 *
 * <p>It decides only lines it can vouch for: a line that is not exactly the writer's shape (not a
 * JSON object, a field of another JSON type than the schema's, a field twice, anything the proof
 * calls malformed) makes the whole scan answer "unusual", and the proof reads the input with Spark
 * SQL instead (the specification, which names and judges every such line). So a line this scan
 * accepts is one Spark's JSON reader reads whole, to the same values. The vocabulary (fields and
 * their types, kinds, what each check needs) comes from Python as JSON: one source of truth.
 */
public final class LineScan {
    private LineScan() {}

    static final int LONG = 0, DOUBLE = 1, STRING = 2, BOOLEAN = 3, ARRAY = 4;

    /** What the Python side says the log is (spark/reconcile.py line_vocabulary, via spark/linescan.py). */
    static final class Spec implements Serializable {
        String[] fields;
        int[] types;
        int[] common;
        String[] kinds;
        boolean[] namesDelivery;
        boolean[] life;
        int[] lifeColumns;
        int[] naming;
        int subOutcomes, completed, pubOutcome, routerStopping;
        int seq, ts, router, epoch, event, delivery, deliveries, by;

        transient Map<String, Integer> fieldIndex;
        transient Map<String, Integer> kindIndex;

        /** Only ``fields`` ([name, type] pairs): what the parser needs, for lines that are not routers' (ledgers). */
        static Spec fieldsOnly(String json) throws IOException {
            Spec s = fields(parseJson(new JsonFactory().createParser(json)));
            s.kinds = new String[0];
            s.index();
            return s;
        }

        private static Spec fields(Map<String, Object> m) {
            Spec s = new Spec();
            List<?> fs = (List<?>) m.get("fields");
            s.fields = new String[fs.size()];
            s.types = new int[fs.size()];
            for (int i = 0; i < fs.size(); i++) {
                List<?> f = (List<?>) fs.get(i);
                s.fields[i] = (String) f.get(0);
                s.types[i] = typeCode((String) f.get(1));
            }
            return s;
        }

        static Spec parse(String json) throws IOException {
            Map<String, Object> m = parseJson(new JsonFactory().createParser(json));
            Spec s = fields(m);
            s.kinds = strings(m.get("kinds"));
            s.index();
            s.common = fieldIndexes(s, strings(m.get("common")));
            s.lifeColumns = fieldIndexes(s, strings(m.get("life_columns")));
            s.naming = fieldIndexes(s, strings(m.get("naming")));
            s.namesDelivery = kindFlags(s, strings(m.get("names_delivery")));
            s.life = kindFlags(s, strings(m.get("life_kinds")));
            s.subOutcomes = s.kind((String) m.get("sub_outcomes"));
            s.completed = s.kind((String) m.get("completed"));
            s.pubOutcome = s.kind((String) m.get("pub_outcome"));
            s.routerStopping = s.kind((String) m.get("router_stopping"));
            s.seq = s.field("seq");
            s.ts = s.field("ts");
            s.router = s.field("router");
            s.epoch = s.field("epoch");
            s.event = s.field("event");
            s.delivery = s.field("delivery");
            s.deliveries = s.field("deliveries");
            s.by = s.field("by");
            return s;
        }

        void index() {
            fieldIndex = new HashMap<>();
            for (int i = 0; i < fields.length; i++) fieldIndex.put(fields[i], i);
            kindIndex = new HashMap<>();
            for (int i = 0; i < kinds.length; i++) kindIndex.put(kinds[i], i);
        }

        /** Whether a name the schema lacks is one of its names in other letter case (Spark may match names so). */
        boolean inOtherCase(String name) {
            for (String f : fields) if (f.equalsIgnoreCase(name)) return true;
            return false;
        }

        int field(String name) {
            Integer i = fieldIndex.get(name);
            if (i == null) throw new IllegalArgumentException("no field " + name + " in the scan's schema");
            return i;
        }

        int kind(String name) {
            Integer i = kindIndex.get(name);
            if (i == null) throw new IllegalArgumentException("no kind " + name);
            return i;
        }

        private void readObject(java.io.ObjectInputStream in) throws IOException, ClassNotFoundException {
            in.defaultReadObject();
            index();
        }

        private static int typeCode(String t) {
            switch (t) {
                case "long": return LONG;
                case "double": return DOUBLE;
                case "string": return STRING;
                case "boolean": return BOOLEAN;
                case "array<string>": return ARRAY;
                default: throw new IllegalArgumentException("unknown type " + t);
            }
        }

        private static String[] strings(Object o) {
            List<?> l = (List<?>) o;
            return l.toArray(new String[0]);
        }

        private static int[] fieldIndexes(Spec s, String[] names) {
            int[] out = new int[names.length];
            for (int i = 0; i < names.length; i++) out[i] = s.field(names[i]);
            return out;
        }

        private static boolean[] kindFlags(Spec s, String[] names) {
            boolean[] out = new boolean[s.kinds.length];
            for (String n : names) {
                Integer i = s.kindIndex.get(n);
                if (i != null) out[i] = true;
            }
            return out;
        }
    }

    /** One line's fields, reused from line to line. */
    static final class Line {
        final int[] seen;
        int generation;
        final long[] longs;
        final double[] doubles;
        final Object[] objects; // String, String[] or Boolean; for a long or double, Boolean.TRUE: present, not null

        Line(int n) {
            seen = new int[n];
            longs = new long[n];
            doubles = new double[n];
            objects = new Object[n];
        }

    }

    /** Sequence numbers of one (router, epoch), as bits in chunks of 65,536. */
    static final class Epoch implements Serializable {
        final String router;
        final long epoch;
        final TreeMap<Long, long[]> chunks = new TreeMap<>();
        long lines, distinct, hi = Long.MIN_VALUE;
        double firstTs = Double.POSITIVE_INFINITY, lastTs = Double.NEGATIVE_INFINITY;
        long stoppingSeq = Long.MAX_VALUE;
        double stoppingTs = Double.POSITIVE_INFINITY;
        transient long lastChunk = -1;
        transient long[] last;

        Epoch(String router, long epoch) {
            this.router = router;
            this.epoch = epoch;
        }

        void add(long seq, double ts, boolean stopping) {
            long bit = seq - 1;
            long c = bit >>> 16;
            if (c != lastChunk || last == null) {
                last = chunks.computeIfAbsent(c, k -> new long[1024]);
                lastChunk = c;
            }
            int w = (int) ((bit >>> 6) & 1023);
            long mask = 1L << (bit & 63);
            if ((last[w] & mask) == 0) {
                last[w] |= mask;
                distinct++;
            }
            lines++;
            if (seq > hi) hi = seq;
            if (ts < firstTs) firstTs = ts;
            if (ts > lastTs) lastTs = ts;
            if (stopping) {
                if (seq < stoppingSeq) stoppingSeq = seq;
                if (ts < stoppingTs) stoppingTs = ts;
            }
        }

        void merge(Epoch o) {
            for (Map.Entry<Long, long[]> e : o.chunks.entrySet()) {
                long[] mine = chunks.get(e.getKey());
                if (mine == null) {
                    chunks.put(e.getKey(), e.getValue());
                    distinct += count(e.getValue());
                } else {
                    long[] theirs = e.getValue();
                    for (int i = 0; i < 1024; i++) {
                        distinct += Long.bitCount(theirs[i] & ~mine[i]);
                        mine[i] |= theirs[i];
                    }
                }
            }
            lines += o.lines;
            hi = Math.max(hi, o.hi);
            firstTs = Math.min(firstTs, o.firstTs);
            lastTs = Math.max(lastTs, o.lastTs);
            stoppingSeq = Math.min(stoppingSeq, o.stoppingSeq);
            stoppingTs = Math.min(stoppingTs, o.stoppingTs);
        }

        private static long count(long[] words) {
            long n = 0;
            for (long w : words) n += Long.bitCount(w);
            return n;
        }

        /** Runs [from, to] of the numbers in 1..hi without a line. */
        List<long[]> missing() {
            List<long[]> runs = new ArrayList<>();
            long start = -1;
            for (long seq = 1; seq <= hi; ) {
                long bit = seq - 1;
                long[] chunk = chunks.get(bit >>> 16);
                if (chunk == null) { // a whole chunk missing
                    if (start < 0) start = seq;
                    seq = ((bit >>> 16) + 1) * 65536 + 1;
                    continue;
                }
                long word = chunk[(int) ((bit >>> 6) & 1023)];
                if (word == -1L && start < 0 && (bit & 63) == 0) {
                    seq += 64;
                    continue;
                }
                boolean present = (word >>> (bit & 63) & 1) != 0;
                if (!present && start < 0) start = seq;
                else if (present && start >= 0) {
                    runs.add(new long[] {start, seq - 1});
                    start = -1;
                }
                seq++;
            }
            if (start >= 0) runs.add(new long[] {start, hi});
            return runs;
        }
    }

    /** What one partition (and then all of them) found. */
    static final class Facts implements Serializable {
        long lines;
        String unusual; // the first line this scan cannot vouch for, and why (null: none)
        long unusualLines;
        long refused, completed, completedSettling;
        long[] perKind;
        final LinkedHashSet<String> named = new LinkedHashSet<>();
        final List<Object[]> life = new ArrayList<>();
        final Map<String, Epoch> epochs = new HashMap<>();

        Facts(int kinds) {
            perKind = new long[kinds];
        }

        void merge(Facts o) {
            lines += o.lines;
            if (unusual == null) unusual = o.unusual;
            unusualLines += o.unusualLines;
            refused += o.refused;
            completed += o.completed;
            completedSettling += o.completedSettling;
            for (int i = 0; i < perKind.length; i++) perKind[i] += o.perKind[i];
            named.addAll(o.named);
            life.addAll(o.life);
            for (Map.Entry<String, Epoch> e : o.epochs.entrySet()) {
                Epoch mine = epochs.get(e.getKey());
                if (mine == null) epochs.put(e.getKey(), e.getValue());
                else mine.merge(e.getValue());
            }
        }
    }

    /** One partition's lines, parsed and folded. */
    static final class Scanner {
        final Spec s;
        final JsonFactory json = new JsonFactory();
        final Line line;
        final Facts facts;
        final Map<String, Boolean> unknown = new HashMap<>();
        String lastRouter;
        long lastEpoch;
        Epoch lastEpochFacts;

        /** The parse of the writer's own shape, tried first (null: Jackson's parse only, for the tests). */
        final WriterLine writer;

        Scanner(Spec s) {
            this(s, true);
        }

        Scanner(Spec s, boolean writerShape) {
            this.s = s;
            this.line = new Line(s.fields.length);
            this.facts = new Facts(s.kinds.length);
            this.writer = writerShape ? new WriterLine(s, line) : null;
        }

        void scan(byte[] bytes, int offset, int length) {
            facts.lines++;
            String why = judge(bytes, offset, length);
            if (why != null) {
                facts.unusualLines++;
                if (facts.unusual == null) facts.unusual = why;
            }
        }

        /** Parses and folds one line; returns why the scan cannot vouch for it, or null. */
        String judge(byte[] bytes, int offset, int length) {
            String why;
            try {
                why = parse(bytes, offset, length);
            } catch (IOException | RuntimeException e) {
                why = "not the writer's JSON: " + e.getMessage();
            }
            return why != null ? why : fold();
        }

        /** Parses one line into ``line``; returns why it is not exactly the writer's shape, or null. */
        String parse(byte[] bytes, int offset, int length) throws IOException {
            int start = offset, end = offset + length;
            while (start < end && (bytes[start] == ' ' || bytes[start] == '\t')) start++;
            if (start >= end || bytes[start] != '{') return "not a JSON object";
            Line l = line;
            l.generation++;
            if (writer != null && writer.parse(bytes, start, end)) return null;
            l.generation++; // (what the writer's-shape parse set, forgotten)
            // Jackson's byte parser, as Spark's JSON reader uses it (a field's text is what Spark reads,
            // and a line that is not UTF-8 fails here as it fails there).
            try (JsonParser p = json.createParser(bytes, start, end - start)) {
                p.nextToken(); // START_OBJECT
                JsonToken t;
                while ((t = p.nextToken()) == JsonToken.FIELD_NAME) {
                    String name = p.currentName();
                    Integer f = s.fieldIndex.get(name);
                    JsonToken v = p.nextToken();
                    if (f == null) {
                        // A field the proof does not read: Spark ignores it too, unless it is one of
                        // the schema's names in other letter case (Spark may match names so).
                        if (otherCase(name)) return "field " + name + " (another case of the schema's)";
                        p.skipChildren();
                        continue;
                    }
                    int i = f;
                    if (l.seen[i] == l.generation) return "field " + s.fields[i] + " twice";
                    l.seen[i] = l.generation;
                    l.objects[i] = null;
                    if (v == JsonToken.VALUE_NULL) continue;
                    switch (s.types[i]) {
                        case LONG:
                            if (v != JsonToken.VALUE_NUMBER_INT || p.getNumberType() == JsonParser.NumberType.BIG_INTEGER)
                                return s.fields[i] + " is not long";
                            l.longs[i] = p.getLongValue();
                            l.objects[i] = Boolean.TRUE;
                            break;
                        case DOUBLE:
                            if (v != JsonToken.VALUE_NUMBER_INT && v != JsonToken.VALUE_NUMBER_FLOAT)
                                return s.fields[i] + " is not double";
                            l.doubles[i] = p.getDoubleValue();
                            l.objects[i] = Boolean.TRUE;
                            break;
                        case STRING:
                            if (v != JsonToken.VALUE_STRING) return s.fields[i] + " is not string";
                            l.objects[i] = p.getText();
                            break;
                        case BOOLEAN:
                            if (v != JsonToken.VALUE_TRUE && v != JsonToken.VALUE_FALSE) return s.fields[i] + " is not boolean";
                            l.objects[i] = v == JsonToken.VALUE_TRUE;
                            break;
                        default: {
                            if (v != JsonToken.START_ARRAY) return s.fields[i] + " is not array<string>";
                            ArrayList<String> items = new ArrayList<>();
                            JsonToken e;
                            while ((e = p.nextToken()) != JsonToken.END_ARRAY) {
                                if (e != JsonToken.VALUE_STRING) return s.fields[i] + " holds a non-string";
                                items.add(p.getText());
                            }
                            l.objects[i] = items.toArray(new String[0]);
                        }
                    }
                }
                if (t != JsonToken.END_OBJECT) return "not a JSON object";
                if (p.nextToken() != null) return "text after the object";
            }
            return null;
        }

        boolean has(int f) {
            return line.seen[f] == line.generation && line.objects[f] != null;
        }

        /** Whether a field name the schema lacks is one of its names in other letter case. */
        boolean otherCase(String name) {
            Boolean known = unknown.get(name);
            if (known == null) {
                known = s.inOtherCase(name);
                unknown.put(name, known);
            }
            return known;
        }

        /** The line's kind (its place in the kinds), set by problem(). */
        int kind;

        /** Why the parsed line is malformed by the proof's rule (reconcile.bad), or null. */
        String problem() {
            Spec s = this.s;
            Line l = line;
            for (int f : s.common) if (!has(f)) return "missing common field " + s.fields[f];
            Integer k = s.kindIndex.get((String) l.objects[s.event]);
            if (k == null) return "unknown kind " + l.objects[s.event];
            kind = k;
            if (l.longs[s.seq] < 1 || l.longs[s.epoch] < 1) return "seq and epoch start at 1";
            boolean delivery = has(s.delivery);
            int size = has(s.deliveries) ? ((String[]) l.objects[s.deliveries]).length : -1;
            if (s.namesDelivery[kind] && !delivery && !(kind == s.subOutcomes && size >= 0)) return "no delivery";
            if (kind == s.subOutcomes && size < 1) return "no deliveries";
            return null;
        }

        String fold() {
            String why = problem();
            if (why != null) return why;
            Spec s = this.s;
            Line l = line;
            int kind = this.kind;
            long seq = l.longs[s.seq], epoch = l.longs[s.epoch];
            boolean delivery = has(s.delivery);
            int size = has(s.deliveries) ? ((String[]) l.objects[s.deliveries]).length : -1;
            long events = kind == s.subOutcomes ? size : kind == s.completed ? (has(s.by) ? 3 : 2) : 1;
            facts.perKind[kind] += events;
            if (kind == s.pubOutcome && !delivery) facts.refused++;
            if (kind == s.completed) {
                facts.completed++;
                if (has(s.by)) facts.completedSettling++;
            }
            for (int f : s.naming) {
                if (!has(f)) continue;
                Object v = l.objects[f];
                if (v instanceof String) facts.named.add((String) v);
                else for (String x : (String[]) v) facts.named.add(x);
            }
            if (s.life[kind]) {
                Object[] row = new Object[s.lifeColumns.length];
                for (int j = 0; j < row.length; j++) row[j] = value(s.lifeColumns[j]);
                facts.life.add(row);
            }
            String router = (String) l.objects[s.router];
            if (lastEpochFacts == null || epoch != lastEpoch || !router.equals(lastRouter)) {
                String key = router + "\u0000" + epoch;
                lastEpochFacts = facts.epochs.computeIfAbsent(key, x -> new Epoch(router, epoch));
                lastRouter = router;
                lastEpoch = epoch;
            }
            lastEpochFacts.add(seq, l.doubles[s.ts], kind == s.routerStopping);
            return null;
        }

        Object value(int f) {
            if (!has(f)) return null;
            switch (s.types[f]) {
                case LONG: return line.longs[f];
                case DOUBLE: return line.doubles[f];
                default: return line.objects[f];
            }
        }
    }

    /** The routers' log files at ``paths`` as Spark's text source reads them: one row per line, split as its JSON reader splits. */
    static JavaRDD<InternalRow> lines(SparkSession spark, List<String> paths, boolean recursive) {
        DataFrameReader reader = spark.read();
        if (recursive) reader = reader.option("recursiveFileLookup", "true").option("pathGlobFilter", "events-*.jsonl");
        return reader.text(paths.toArray(new String[0])).queryExecution().toRdd().toJavaRDD();
    }

    /** What takes a line's bytes. */
    interface LineSink {
        void line(byte[] bytes, int offset, int length);
    }

    /** A line's bytes to ``sink``, without a copy when Spark holds them in an array. */
    static void feed(InternalRow row, LineSink sink) {
        UTF8String text = row.getUTF8String(0);
        Object base = text.getBaseObject();
        if (base instanceof byte[]) {
            sink.line((byte[]) base, (int) (text.getBaseOffset() - org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET), text.numBytes());
        } else {
            byte[] copy = text.getBytes();
            sink.line(copy, 0, copy.length);
        }
    }

    /** The scan of the files at ``paths`` (JSON lines); its facts as JSON for spark/linescan.py. */
    public static String inputFacts(SparkSession spark, List<String> paths, String specJson, boolean recursive) throws IOException {
        Spec spec = Spec.parse(specJson);
        List<Facts> parts = lines(spark, paths, recursive).mapPartitions((Iterator<InternalRow> it) -> {
            Scanner scanner = new Scanner(spec);
            while (it.hasNext()) feed(it.next(), scanner::scan);
            List<Facts> one = new ArrayList<>(1);
            one.add(scanner.facts);
            return one.iterator();
        }).collect();
        return merged(spec, parts);
    }

    /** The partitions' facts, merged in partition order, as JSON for spark/linescan.py. */
    static String merged(Spec spec, Iterable<Facts> parts) throws IOException {
        Facts all = new Facts(spec.kinds.length);
        for (Facts f : parts) all.merge(f);
        return toJson(spec, all);
    }

    /**
     * Each line judged alone, for the tests (tests/spark/test_line_scan.py): {"why": ...} for a line
     * the scan declines, else {"values": [...]}, the line's fields in the schema's order.
     */
    public static String judgeLines(List<byte[]> lines, String specJson) throws IOException {
        return judgeLines(lines, specJson, true);
    }

    /** As above; ``writerShape`` false: with Jackson's parse only (what the writer's-shape parse must agree with). */
    public static String judgeLines(List<byte[]> lines, String specJson, boolean writerShape) throws IOException {
        Spec spec = Spec.parse(specJson);
        StringWriter out = new StringWriter();
        try (JsonGenerator g = new JsonFactory().createGenerator(out)) {
            g.writeStartArray();
            for (byte[] line : lines) {
                Scanner scanner = new Scanner(spec, writerShape);
                String why = scanner.judge(line, 0, line.length);
                g.writeStartObject();
                if (why != null) g.writeStringField("why", why);
                else {
                    g.writeArrayFieldStart("values");
                    for (int f = 0; f < spec.fields.length; f++) writeValue(g, scanner.value(f));
                    g.writeEndArray();
                }
                g.writeEndObject();
            }
            g.writeEndArray();
        }
        return out.toString();
    }

    /** For the tests: which of ``lines`` the writer's-shape parse takes (the others go to Jackson's). */
    public static boolean[] writerShapeTakes(List<byte[]> lines, String specJson) throws IOException {
        Spec spec = Spec.parse(specJson);
        boolean[] taken = new boolean[lines.size()];
        for (int i = 0; i < taken.length; i++) {
            byte[] line = lines.get(i);
            Scanner scanner = new Scanner(spec);
            scanner.line.generation++;
            taken[i] = line.length > 0 && line[0] == '{' && scanner.writer.parse(line, 0, line.length);
        }
        return taken;
    }

    static String toJson(Spec s, Facts f) throws IOException {
        StringWriter out = new StringWriter();
        try (JsonGenerator g = new JsonFactory().createGenerator(out)) {
            g.writeStartObject();
            g.writeNumberField("lines", f.lines);
            g.writeNumberField("unusual_lines", f.unusualLines);
            if (f.unusual != null) g.writeStringField("unusual", f.unusual);
            if (f.unusual == null) {
                g.writeNumberField("refused", f.refused);
                g.writeNumberField("completed", f.completed);
                g.writeNumberField("completed_settling", f.completedSettling);
                g.writeArrayFieldStart("per_kind");
                for (long n : f.perKind) g.writeNumber(n);
                g.writeEndArray();
                g.writeArrayFieldStart("named");
                for (String n : f.named) g.writeString(n);
                g.writeEndArray();
                g.writeArrayFieldStart("life");
                for (Object[] row : f.life) {
                    g.writeStartArray();
                    for (Object v : row) writeValue(g, v);
                    g.writeEndArray();
                }
                g.writeEndArray();
                g.writeArrayFieldStart("epochs");
                for (Epoch e : f.epochs.values()) {
                    g.writeStartObject();
                    g.writeStringField("router", e.router);
                    g.writeNumberField("epoch", e.epoch);
                    g.writeNumberField("distinct", e.distinct);
                    g.writeNumberField("lines", e.lines);
                    g.writeNumberField("last_seq", e.hi);
                    g.writeNumberField("first_ts", e.firstTs);
                    g.writeNumberField("last_ts", e.lastTs);
                    if (e.stoppingSeq != Long.MAX_VALUE) {
                        g.writeNumberField("stopping_seq", e.stoppingSeq);
                        g.writeNumberField("stopping_ts", e.stoppingTs);
                    }
                    g.writeArrayFieldStart("missing");
                    if (e.distinct != e.hi) {
                        for (long[] run : e.missing()) {
                            g.writeStartArray();
                            g.writeNumber(run[0]);
                            g.writeNumber(run[1]);
                            g.writeEndArray();
                        }
                    }
                    g.writeEndArray();
                    g.writeEndObject();
                }
                g.writeEndArray();
            }
            g.writeEndObject();
        }
        return out.toString();
    }

    private static void writeValue(JsonGenerator g, Object v) throws IOException {
        if (v == null) g.writeNull();
        else if (v instanceof Long) g.writeNumber((Long) v);
        else if (v instanceof Double) g.writeNumber((Double) v);
        else if (v instanceof Boolean) g.writeBoolean((Boolean) v);
        else if (v instanceof String[]) {
            g.writeStartArray();
            for (String x : (String[]) v) g.writeString(x);
            g.writeEndArray();
        } else g.writeString((String) v);
    }

    @SuppressWarnings("unchecked")
    static Map<String, Object> parseJson(JsonParser p) throws IOException {
        p.nextToken();
        return (Map<String, Object>) readValue(p);
    }

    private static Object readValue(JsonParser p) throws IOException {
        switch (p.currentToken()) {
            case START_OBJECT: {
                Map<String, Object> m = new HashMap<>();
                while (p.nextToken() == JsonToken.FIELD_NAME) {
                    String k = p.currentName();
                    p.nextToken();
                    m.put(k, readValue(p));
                }
                return m;
            }
            case START_ARRAY: {
                List<Object> l = new ArrayList<>();
                while (p.nextToken() != JsonToken.END_ARRAY) l.add(readValue(p));
                return l;
            }
            case VALUE_STRING: return p.getText();
            case VALUE_NUMBER_INT: return p.getLongValue();
            case VALUE_NULL: return null;
            case VALUE_TRUE: return true;
            case VALUE_FALSE: return false;
            default: return p.getDoubleValue();
        }
    }
}
