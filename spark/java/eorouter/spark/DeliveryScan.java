package eorouter.spark;

import com.fasterxml.jackson.core.JsonFactory;
import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.XXH64;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The per-delivery pass's rows (spark/reconcile.py: unfold, then narrow) as plain Java: a line the
 * scan has parsed and found in the writer's shape (LineScan's parser and checks), if folded,
 * unfolded into the events it stands for, and each event that names a delivery made into the short
 * row the one shuffle by delivery carries (routers and subscribers as Spark's own xxhash64, kinds and
 * outcomes as codes). ReadOnce runs it on each line as it parses it for the first read.
 *
 * <p>The rows' schema comes from the SQL narrow() it stands for, so the two are one shuffle's input.
 */
public final class DeliveryScan {
    private DeliveryScan() {}

    static final long SEED = 42L; // Spark's xxhash64 seed

    /** A folded kind: the events it stands for, and each event's fields as line fields. */
    static final class Fold implements Serializable {
        private static final long serialVersionUID = 1L;
        int[] events; // kind codes (places in the kinds)
        int[][] map; // map[event][field] = the line field it reads, -1 none (null), -2 the line's own
        int runField = -1; // the line's list of deliveries, one events[0] each
        int optionalLast = -1; // the last event only when this line field is set
    }

    static final class Vocabulary implements Serializable {
        private static final long serialVersionUID = 1L;
        LineScan.Spec spec;
        Fold[] folds; // by kind code, null: not folded
        int[] kindCode; // by kind place: the per-delivery rows' code (KIND), 0 for a kind the proof ignores
        Map<String, Integer> outcomes;
        int otherOutcome;
        Map<String, Integer> by;
        int otherBy;
        String remembered, beyondHorizon, atLeastOnce, filteredReason;
        int received, settled, pubOutcome, forwardedToRouter, owedMoved, owedStateDiscarded;
        int subscriber, outcome, originRouter, toRouter, fromRouter, owed, dests, subscribers, forwarded;
        int routers, deleted, settledField, byField, reason, condition, guarantee, filtered;
        String schemaJson;
        int[] idFields;

        @SuppressWarnings("unchecked")
        static Vocabulary parse(String specJson, String deliveryJson) throws IOException {
            Vocabulary v = new Vocabulary();
            LineScan.Spec s = LineScan.Spec.parse(specJson);
            v.spec = s;
            Map<String, Object> m = LineScan.parseJson(new JsonFactory().createParser(deliveryJson));
            Map<String, Object> kinds = (Map<String, Object>) m.get("kind_codes");
            v.kindCode = new int[s.kinds.length];
            for (int i = 0; i < s.kinds.length; i++) {
                Object code = kinds.get(s.kinds[i]);
                v.kindCode[i] = code == null ? 0 : ((Long) code).intValue();
            }
            v.outcomes = codes((Map<String, Object>) m.get("outcomes"));
            v.otherOutcome = ((Long) m.get("other_outcome")).intValue();
            v.by = codes((Map<String, Object>) m.get("by"));
            v.otherBy = ((Long) m.get("other_by")).intValue();
            v.remembered = (String) m.get("remembered");
            v.beyondHorizon = (String) m.get("beyond_horizon");
            v.atLeastOnce = (String) m.get("at_least_once");
            v.filteredReason = (String) m.get("filtered_reason");
            v.folds = new Fold[s.kinds.length];
            for (Map.Entry<String, Object> e : ((Map<String, Object>) m.get("folds")).entrySet()) {
                Map<String, Object> f = (Map<String, Object>) e.getValue();
                Fold fold = new Fold();
                List<Object> events = (List<Object>) f.get("events");
                List<Object> fields = (List<Object>) f.get("fields");
                fold.events = new int[events.size()];
                fold.map = new int[events.size()][s.fields.length];
                java.util.Set<Integer> folded = new java.util.HashSet<>();
                for (Object one : fields) for (Object name : ((Map<String, Object>) one).keySet()) folded.add(s.field((String) name));
                for (int i = 0; i < events.size(); i++) {
                    fold.events[i] = s.kind((String) events.get(i));
                    java.util.Arrays.fill(fold.map[i], -2);
                    Map<String, Object> mine = (Map<String, Object>) fields.get(i);
                    boolean run = f.get("run_field") != null;
                    for (int field : folded) {
                        Object line = mine.get(s.fields[field]);
                        // As spark/reconcile.py unfold(): a run's events keep the line's fields (their
                        // names are the line's); each event of any other fold reads its own
                        // mapping, and a field only other events of the fold have is null.
                        if (run) fold.map[i][field] = line == null || line.equals(s.fields[field]) ? -2 : s.field((String) line);
                        else fold.map[i][field] = line == null ? -1 : s.field((String) line);
                    }
                }
                if (f.get("run_field") != null) fold.runField = s.field((String) f.get("run_field"));
                if (f.get("optional_last") != null) fold.optionalLast = s.field((String) f.get("optional_last"));
                v.folds[s.kind(e.getKey())] = fold;
            }
            v.received = s.kind("received");
            v.settled = s.kind("settled");
            v.pubOutcome = s.kind("pub-outcome");
            v.forwardedToRouter = s.kind("forwarded-to-router");
            v.owedMoved = s.kind("owed-moved");
            v.owedStateDiscarded = s.kind("owed-state-discarded");
            v.subscriber = s.field("subscriber");
            v.outcome = s.field("outcome");
            v.originRouter = s.field("origin_router");
            v.toRouter = s.field("to_router");
            v.fromRouter = s.field("from_router");
            v.owed = s.field("owed");
            v.dests = s.field("dests");
            v.subscribers = s.field("subscribers");
            v.forwarded = s.field("forwarded");
            v.routers = s.field("routers");
            v.deleted = s.field("deleted");
            v.settledField = s.field("settled");
            v.byField = s.field("by");
            v.reason = s.field("reason");
            v.condition = s.field("condition");
            v.guarantee = s.field("guarantee");
            v.filtered = s.field("filtered");
            v.schemaJson = (String) m.get("schema");
            StructType id = (StructType) ((StructType) DataType.fromJson(v.schemaJson)).apply("id").dataType();
            v.idFields = new int[id.fields().length];
            for (int i = 0; i < v.idFields.length; i++) v.idFields[i] = s.field(id.fields()[i].name());
            return v;
        }

        private static Map<String, Integer> codes(Map<String, Object> m) {
            Map<String, Integer> out = new HashMap<>();
            for (Map.Entry<String, Object> e : m.entrySet()) out.put(e.getKey(), ((Long) e.getValue()).intValue());
            return out;
        }
    }

    /** The rows of one partition's lines. */
    static final class Narrower {
        final Vocabulary v;
        final LineScan.Scanner scanner;
        final LineScan.Line line;
        final int[] columns; // each output column's rule (COLUMNS)
        final List<InternalRow> out = new ArrayList<>();
        // Names (routers, subscribers) are few and repeat on every line: each hashed once.
        final Map<String, Long> hashed = new HashMap<>();
        UTF8String deliveryText;
        // One event of the line: its kind, its delivery, its place in the line, which of its fold's
        // events it is (a run's events are all the first), its fold (or null).
        int kind, pos, part;
        String delivery;
        Fold fold;

        Narrower(Vocabulary v) {
            this.v = v;
            this.scanner = new LineScan.Scanner(v.spec);
            this.line = scanner.line;
            String[] names = ((StructType) DataType.fromJson(v.schemaJson)).fieldNames();
            columns = new int[names.length];
            for (int c = 0; c < names.length; c++) {
                columns[c] = java.util.Arrays.asList(COLUMNS).indexOf(names[c]);
                if (columns[c] < 0) throw new IllegalArgumentException("eorouter: no rule for the column " + names[c]);
            }
        }

        /** The rows of the line the scanner has just parsed and found in the writer's shape (its kind set). */
        void parsed() {
            int lineKind = scanner.kind;
            Fold f = v.folds[lineKind];
            if (f == null) {
                if (!scanner.has(v.spec.delivery)) return;
                event(lineKind, (String) line.objects[v.spec.delivery], 0, 0, null);
            } else if (f.runField >= 0) {
                String[] ds = (String[]) line.objects[f.runField];
                for (int i = 0; i < ds.length; i++) event(f.events[0], ds[i], i, 0, f);
            } else {
                if (!scanner.has(v.spec.delivery)) return;
                int n = f.optionalLast >= 0 && !scanner.has(f.optionalLast) ? f.events.length - 1 : f.events.length;
                for (int i = 0; i < n; i++) event(f.events[i], (String) line.objects[v.spec.delivery], i, i, f);
            }
        }

        /** The line field an event's field reads (-1: none, the event's field is null). */
        int at(int field) {
            if (fold == null) return field;
            int m = fold.map[part][field];
            return m == -2 ? field : m;
        }

        Object get(int field) {
            int f = at(field);
            return f >= 0 && scanner.has(f) ? scanner.value(f) : null;
        }

        String str(int field) {
            return (String) get(field);
        }

        Long hash(String name) {
            if (name == null) return null;
            Long h = hashed.get(name);
            if (h == null) {
                h = XXH64.hashUTF8String(UTF8String.fromString(name), SEED);
                hashed.put(name, h);
            }
            return h;
        }

        GenericArrayData hashes(int field) {
            String[] names = (String[]) get(field);
            if (names == null) return null;
            Object[] out = new Object[names.length];
            for (int i = 0; i < names.length; i++) out[i] = hash(names[i]);
            return new GenericArrayData(out);
        }

        void event(int kind, String delivery, int pos, int part, Fold fold) {
            if (delivery == null) return;
            this.kind = kind;
            this.delivery = delivery;
            this.pos = pos;
            this.part = part;
            this.fold = fold;
            this.deliveryText = UTF8String.fromString(delivery);
            Object[] row = new Object[columns.length];
            for (int c = 0; c < columns.length; c++) row[c] = column(columns[c]);
            out.add(new GenericInternalRow(row));
        }

        /** The columns narrow() makes, each with its rule below (by place). */
        static final String[] COLUMNS = {"h", "delivery", "r", "e", "q", "t", "k", "s", "o", "p", "l", "f", "x", "b", "y", "fl", "id", "_pos"};

        Object column(int rule) {
            Vocabulary v = this.v;
            LineScan.Spec s = v.spec;
            switch (rule) {
                case 0: return XXH64.hashUTF8String(deliveryText, SEED);
                case 1: return deliveryText;
                case 2: return hash(str(s.router));
                case 3: return get(s.epoch);
                case 4: return get(s.seq);
                case 5: return get(s.ts);
                case 6: return v.kindCode[kind];
                case 7: return hash(str(v.subscriber));
                case 8: {
                    String o = str(v.outcome);
                    return o == null ? null : v.outcomes.getOrDefault(o, v.otherOutcome);
                }
                case 9: {
                    String p = str(v.originRouter);
                    if (p == null) p = str(v.toRouter);
                    if (p == null) p = str(v.fromRouter);
                    return hash(p);
                }
                case 10:
                    if (kind == v.received) return hashes(v.owed);
                    if (kind == v.forwardedToRouter) return hashes(v.dests);
                    if (kind == v.owedMoved) return hashes(v.subscribers);
                    return null;
                case 11: return kind == v.received ? hashes(v.forwarded) : null;
                case 12: return kind == v.received ? hashes(v.routers) : null;
                case 13: return kind == v.settled ? get(v.deleted) : get(v.settledField);
                case 14: {
                    if (kind == v.settled) {
                        String by = str(v.byField);
                        return by == null ? null : v.by.getOrDefault(by, v.otherBy);
                    }
                    if (kind == v.pubOutcome && v.remembered.equals(str(v.reason))) return 1;
                    if (kind == v.pubOutcome && v.beyondHorizon.equals(str(v.condition))) return 2;
                    if (kind == v.owedStateDiscarded && v.filteredReason.equals(str(v.reason))) return 3;
                    if (kind == v.received && v.atLeastOnce.equals(str(v.guarantee))) return 4;
                    return null;
                }
                case 15: return kind == v.received && get(v.filtered) != null ? hashes(v.filtered) : null;
                case 16: {
                    if (kind != v.received) return null;
                    Object[] id = new Object[v.idFields.length];
                    for (int i = 0; i < id.length; i++) {
                        Object x = get(v.idFields[i]);
                        id[i] = x instanceof String ? UTF8String.fromString((String) x) : x;
                    }
                    return new GenericInternalRow(id);
                }
                case 17: return pos;
                default: throw new IllegalArgumentException("eorouter: no rule " + rule);
            }
        }
    }
}
