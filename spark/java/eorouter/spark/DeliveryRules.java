package eorouter.spark;

import com.fasterxml.jackson.core.JsonFactory;
import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The per-delivery rules (spark/reconcile.py delivery_facts: one row per delivery, its violations and
 * the facts the other checks read) as plain Java over each delivery's events, taken straight from the
 * one shuffle by delivery, sorted (no collected array of structs, no projection per rule).
 *
 * <p>The SQL is the specification; this is its twin, rule for rule, and tests/spark/test_delivery_rules.py
 * holds the two to the same rows. Spark SQL's null logic is followed where the writer's events can hold a
 * null; a delivery whose events hold one where the writer never writes one (a subscriber-less answer, an
 * outcome-less outcome, a list with a null in it, ...) is not judged here: the job fails with
 * {@link #UNUSUAL} and the proof runs the SQL rules instead, which judge every input.
 */
public final class DeliveryRules {
    private DeliveryRules() {}

    /** The job's error for input these rules leave to Spark SQL (spark/rules.py looks for it). */
    public static final String UNUSUAL = "eorouter: a delivery outside the Java rules' shape";

    // ------------------------------------------------------------------ vocabulary and constants

    static final class Vocabulary implements Serializable {
        private static final long serialVersionUID = 1L;
        int received, forwarded, subOutcome, pubOutcome, settled, recordDeleted, expired, forwardedToRouter;
        int outcomeToRouter, outcomeFromRouter, placeholderCreated, placeholderFulfilled, owedMoved, owedStateDiscarded;
        int app, acc, expiredCode, none;
        boolean[] referencing = new boolean[256], needsRecord = new boolean[256], badCodes = new boolean[256];
        double clockSlack;
        boolean ledgers;
        String schemaJson;

        @SuppressWarnings("unchecked")
        static Vocabulary parse(String json) throws IOException {
            Map<String, Object> m = LineScan.parseJson(new JsonFactory().createParser(json));
            Map<String, Object> kind = (Map<String, Object>) m.get("kind");
            Vocabulary v = new Vocabulary();
            v.received = code(kind, "received");
            v.forwarded = code(kind, "forwarded");
            v.subOutcome = code(kind, "sub-outcome");
            v.pubOutcome = code(kind, "pub-outcome");
            v.settled = code(kind, "settled");
            v.recordDeleted = code(kind, "record-deleted");
            v.expired = code(kind, "expired");
            v.forwardedToRouter = code(kind, "forwarded-to-router");
            v.outcomeToRouter = code(kind, "outcome-to-router");
            v.outcomeFromRouter = code(kind, "outcome-from-router");
            v.placeholderCreated = code(kind, "placeholder-created");
            v.placeholderFulfilled = code(kind, "placeholder-fulfilled");
            v.owedMoved = code(kind, "owed-moved");
            v.owedStateDiscarded = code(kind, "owed-state-discarded");
            v.app = ((Long) m.get("app")).intValue();
            v.acc = ((Long) m.get("accepted")).intValue();
            v.expiredCode = ((Long) m.get("expired")).intValue();
            v.none = ((Long) m.get("none")).intValue();
            for (Object k : (List<Object>) m.get("referencing")) v.referencing[code(kind, (String) k)] = true;
            for (Object k : (List<Object>) m.get("needs_record")) v.needsRecord[code(kind, (String) k)] = true;
            for (Object o : (List<Object>) m.get("not_accepted")) v.badCodes[((Long) o).intValue()] = true;
            v.clockSlack = ((Number) m.get("clock_slack")).doubleValue();
            v.ledgers = (Boolean) m.get("ledgers");
            v.schemaJson = (String) m.get("schema");
            return v;
        }

        private static int code(Map<String, Object> kind, String name) {
            return ((Long) kind.get(name)).intValue();
        }
    }

    static final class End implements Serializable {
        private static final long serialVersionUID = 1L;
        long seq;
    }

    static final class Span implements Serializable {
        private static final long serialVersionUID = 1L;
        long from, to, durable;
    }

    static final class Route implements Serializable {
        private static final long serialVersionUID = 1L;
        long seq;
        double ts;
        long[] reachable;
    }

    static final class Gone implements Serializable {
        private static final long serialVersionUID = 1L;
        double ts;
        String topic, re;
        transient Pattern pattern;

        boolean matches(String subject) {
            if (pattern == null) pattern = Pattern.compile(re);
            Matcher m = pattern.matcher(subject);
            return m.find(0); // Spark's rlike
        }
    }

    /** small_tables()' constants, keyed as reconcile.Constants keys them ("router|epoch|subscriber"). */
    static final class Constants implements Serializable {
        private static final long serialVersionUID = 1L;
        Map<String, End[]> ends = new HashMap<>();
        Map<String, Span[]> durable = new HashMap<>();
        Map<String, Route[]> routes = new HashMap<>();
        Map<String, Gone[]> gone = new HashMap<>();
        Set<String> died = new HashSet<>();
        Set<Long> attached = new HashSet<>();
        Set<Long> missing = new HashSet<>();

        @SuppressWarnings("unchecked")
        static Constants parse(String json) throws IOException {
            Map<String, Object> m = LineScan.parseJson(new JsonFactory().createParser(json));
            Constants c = new Constants();
            for (Map.Entry<String, Object> e : ((Map<String, Object>) m.get("ends")).entrySet()) {
                List<Object> l = (List<Object>) e.getValue();
                End[] out = new End[l.size()];
                for (int i = 0; i < out.length; i++) {
                    out[i] = new End();
                    out[i].seq = ((Number) ((Map<String, Object>) l.get(i)).get("seq")).longValue();
                }
                c.ends.put(e.getKey(), out);
            }
            for (Map.Entry<String, Object> e : ((Map<String, Object>) m.get("durable")).entrySet()) {
                List<Object> l = (List<Object>) e.getValue();
                Span[] out = new Span[l.size()];
                for (int i = 0; i < out.length; i++) {
                    Map<String, Object> x = (Map<String, Object>) l.get(i);
                    out[i] = new Span();
                    out[i].from = ((Number) x.get("from")).longValue();
                    out[i].to = ((Number) x.get("to")).longValue();
                    out[i].durable = ((Number) x.get("durable")).longValue();
                }
                c.durable.put(e.getKey(), out);
            }
            for (Map.Entry<String, Object> e : ((Map<String, Object>) m.get("routes")).entrySet()) {
                List<Object> l = (List<Object>) e.getValue();
                Route[] out = new Route[l.size()];
                for (int i = 0; i < out.length; i++) {
                    Map<String, Object> x = (Map<String, Object>) l.get(i);
                    out[i] = new Route();
                    out[i].seq = ((Number) x.get("seq")).longValue();
                    out[i].ts = ((Number) x.get("ts")).doubleValue();
                    List<Object> r = (List<Object>) x.get("reachable");
                    out[i].reachable = new long[r.size()];
                    for (int j = 0; j < r.size(); j++) out[i].reachable[j] = ((Number) r.get(j)).longValue();
                }
                c.routes.put(e.getKey(), out);
            }
            for (Map.Entry<String, Object> e : ((Map<String, Object>) m.get("gone")).entrySet()) {
                List<Object> l = (List<Object>) e.getValue();
                Gone[] out = new Gone[l.size()];
                for (int i = 0; i < out.length; i++) {
                    Map<String, Object> x = (Map<String, Object>) l.get(i);
                    out[i] = new Gone();
                    out[i].ts = ((Number) x.get("ts")).doubleValue();
                    out[i].topic = (String) x.get("topic");
                    out[i].re = (String) x.get("re");
                }
                c.gone.put(e.getKey(), out);
            }
            for (Object d : (List<Object>) m.get("died")) c.died.add((String) d);
            for (Object a : (List<Object>) m.get("attached")) c.attached.add(((Number) a).longValue());
            for (Object a : (List<Object>) m.get("missing")) c.missing.add(((Number) a).longValue());
            return c;
        }
    }

    // ------------------------------------------------------------------ one delivery's events

    /** One event of narrow()'s rows (app_events()' too: r null, e the split, q the row, p the file). */
    static final class Ev {
        Long r, e, q, s, p;
        Double t;
        int k;
        Integer o, y;
        Boolean b;
        long[] l, f, x, fl;
        boolean rep;
        InternalRow id;
        Long streamSeq;
        /** Its delivery id and place in its line: the pass orders a hash's events by them (Reader.event). */
        UTF8String d;
        long pos;
    }

    static boolean eq(Long a, Long b) {
        return a != null && b != null && a.longValue() == b.longValue();
    }

    static boolean has(long[] list, Long v) {
        if (list == null || v == null) return false;
        for (long x : list) if (x == v) return true;
        return false;
    }

    static boolean has(List<Long> list, Long v) {
        if (v == null) return false;
        for (Long x : list) if (x.longValue() == v.longValue()) return true;
        return false;
    }

    static List<Long> distinct(List<Long> in) {
        List<Long> out = new ArrayList<>(in.size());
        for (Long x : in) if (!has(out, x)) out.add(x);
        return out;
    }

    /** Spark's ordering of two values of a struct's field (nulls first, ascending). */
    @SuppressWarnings({"unchecked", "rawtypes"})
    static int cmp(Object a, Object b) {
        if (a == null) return b == null ? 0 : -1;
        if (b == null) return 1;
        return ((Comparable) a).compareTo(b);
    }

    /** Struct values compared field by field, as array_min orders named_structs. */
    static int cmpAll(Object[] a, Object[] b) {
        for (int i = 0; i < a.length; i++) {
            int c = cmp(a[i], b[i]);
            if (c != 0) return c;
        }
        return 0;
    }

    static String key(Long a, Long b) {
        return a + "|" + b;
    }

    static String key(Long a, Long b, Long c) {
        return a + "|" + b + "|" + c;
    }

    // ------------------------------------------------------------------ JSON of info (Spark's to_json)

    /** A JSON object written as Spark's to_json writes a named_struct: fields in order, nulls left out. */
    static final class Json {
        final StringBuilder sb = new StringBuilder("{");
        boolean first = true;

        Json field(String name, Object value) {
            if (value == null) return this;
            if (!first) sb.append(',');
            first = false;
            sb.append('"').append(name).append("\":");
            write(sb, value);
            return this;
        }

        String done() {
            return sb.append('}').toString();
        }

        static void write(StringBuilder sb, Object value) {
            if (value == null) {
                sb.append("null");
            } else if (value instanceof Json) {
                sb.append(((Json) value).done());
            } else if (value instanceof List) {
                sb.append('[');
                boolean first = true;
                for (Object x : (List<?>) value) {
                    if (!first) sb.append(',');
                    first = false;
                    write(sb, x);
                }
                sb.append(']');
            } else if (value instanceof long[]) {
                sb.append('[');
                long[] xs = (long[]) value;
                for (int i = 0; i < xs.length; i++) {
                    if (i > 0) sb.append(',');
                    sb.append(xs[i]);
                }
                sb.append(']');
            } else {
                sb.append(value); // numbers and booleans: Java's own text is JSON's for these
            }
        }
    }

    // ------------------------------------------------------------------ the rules

    /** The per-delivery rules over one delivery's events (in the shuffle's order). */
    static final class Judge {
        final Vocabulary v;
        final Constants c;
        final StructType schema;
        final int[] outColumns;

        Judge(Vocabulary v, Constants c) {
            this.v = v;
            this.c = c;
            this.schema = (StructType) DataType.fromJson(v.schemaJson);
            String[] names = schema.fieldNames();
            outColumns = new int[names.length];
            for (int i = 0; i < names.length; i++) {
                outColumns[i] = Arrays.asList(OUT).indexOf(names[i]);
                if (outColumns[i] < 0) throw new IllegalArgumentException("eorouter: no rule for the column " + names[i]);
            }
        }

        static final String[] OUT = {
            "delivery", "topic", "publisher", "link_name", "incarnation", "pub_tag", "stream_seq", "pub_id", "stream",
            "received", "presettled", "origin", "origin_epoch", "recv_ts", "pub", "told_accepted", "recvs", "subs",
            "first_sends", "died_with", "app", "app_missing", "partial", "horizon", "filtered", "alo", "alo_dups",
            "alo_app_dups", "v"
        };

        static final Pattern SPLIT_NUMBER = Pattern.compile("\\.(\\d+)$");

        /** A record (a received event not settled on arrival) with its router's first answer in that epoch. */
        static final class Rec {
            Ev ev;
            long[] owed, routers;
            Object[] ans; // (q, o) or null
        }

        static final class Send {
            Long r, e, q, s;
            Double t;

            Send(Long r, Long e, Long q, Long s, Double t) {
                this.r = r;
                this.e = e;
                this.q = q;
                this.s = s;
                this.t = t;
            }
        }

        static void unusual(String why, String delivery) {
            throw new IllegalStateException(UNUSUAL + " (" + why + "; delivery " + delivery + ")");
        }

        void check(List<Ev> ev, String delivery) {
            for (Ev x : ev) {
                int k = x.k;
                if (k == v.app) {
                    if (x.s == null || x.e == null || x.q == null) unusual("a ledger line without its subscriber or place", delivery);
                    continue;
                }
                if (x.r == null || x.e == null || x.q == null || x.t == null) unusual("an event without router, epoch, seq or ts", delivery);
                if ((k == v.subOutcome || k == v.forwarded || k == v.expired || k == v.owedStateDiscarded
                        || k == v.placeholderCreated || k == v.placeholderFulfilled) && x.s == null) {
                    unusual("an event about a subscriber without one", delivery);
                }
                if ((k == v.subOutcome || k == v.pubOutcome || k == v.outcomeToRouter || k == v.outcomeFromRouter) && x.o == null) {
                    unusual("an outcome event without its outcome", delivery);
                }
                if ((k == v.outcomeFromRouter || k == v.forwardedToRouter || k == v.owedMoved) && x.p == null) {
                    unusual("an event between routers without the other router", delivery);
                }
                if (k == v.received && x.id != null && x.id.isNullAt(0)) unusual("a received event without its topic", delivery);
            }
        }

        Object[] judge(List<Ev> ev, UTF8String deliveryText) {
            return new One(ev, deliveryText).judge();
        }

        /** One delivery being judged: its events, what the rules derive from them, its violations. */
        final class One {
            final List<Ev> ev;
            final UTF8String deliveryText;
            final String delivery;
            final List<Ev> recvAll = new ArrayList<>(), records = new ArrayList<>(), pubs = new ArrayList<>(), moves = new ArrayList<>();
            final List<Ev> answers = new ArrayList<>(), placeholders = new ArrayList<>(), apps = new ArrayList<>();
            final List<Long> accSubs = new ArrayList<>(), discarded = new ArrayList<>(), filteredOut = new ArrayList<>();
            final List<Long> movedSubs = new ArrayList<>(), owedSubs = new ArrayList<>(), movedFrom = new ArrayList<>();
            final List<Send> sends = new ArrayList<>(), forwardedSends = new ArrayList<>();
            final List<Object[]> violations = new ArrayList<>();
            boolean alo, horizon, received, toldAccepted, partial;
            Ev idEv, pub, originAnswer;
            Rec origin;
            String topic;
            List<Rec> recs;
            List<Long> done, reached, appMissing, filtered;
            List<Map.Entry<Long, List<Ev>>> twice;
            List<Object[]> pairs, diedWith, app, firstSends, subs;

            One(List<Ev> ev, UTF8String deliveryText) {
                this.ev = ev;
                this.deliveryText = deliveryText;
                this.delivery = deliveryText.toString();
            }

            /** The rules in the SQL's order (each check's violations after the one before). */
            Object[] judge() {
                gather();
                lost();
                duplicated();
                invented();
                recordMissing();
                arrival();
                unowedAndUnsent();
                answerMissing();
                disagrees();
                leftUnsettled();
                applications();
                firstSends();
                statuses();
                return row();
            }

            void gather() {
            check(ev, delivery);
            for (Ev x : ev) {
                int k = x.k;
                if (k == v.received) {
                    recvAll.add(x);
                    if (x.b == null || !x.b) {
                        records.add(x);
                        if (x.l != null) for (long s : x.l) if (!has(owedSubs, s)) owedSubs.add(s);
                    }
                    if (x.fl != null) for (long s : x.fl) if (!has(filteredOut, s)) filteredOut.add(s);
                    if (x.f != null) for (long s : x.f) sends.add(new Send(x.r, x.e, x.q, s, x.t));
                    if (x.y != null && x.y == 4) alo = true;
                    if (x.streamSeq != null && (idEv == null || x.streamSeq < idEv.streamSeq)) idEv = x;
                } else if (k == v.pubOutcome) {
                    if (x.y == null || x.y != 2) pubs.add(x);
                    else horizon = true;
                } else if (k == v.subOutcome) {
                    if (x.o == v.acc && !has(accSubs, x.s)) accSubs.add(x.s);
                    if (!x.rep) answers.add(x);
                } else if (k == v.owedStateDiscarded) {
                    discarded.add(x.s);
                } else if (k == v.owedMoved) {
                    moves.add(x);
                    if (x.l != null) for (long s : x.l) movedSubs.add(s);
                    movedFrom.add(x.p);
                } else if (k == v.forwarded) {
                    forwardedSends.add(new Send(x.r, x.e, x.q, x.s, x.t));
                } else if (k == v.placeholderCreated) {
                    placeholders.add(x);
                } else if (k == v.app) {
                    apps.add(x);
                }
            }
            sends.addAll(forwardedSends);
            received = !recvAll.isEmpty();

            recs = new ArrayList<>(records.size());
            for (Ev rec : records) {
                Rec r = new Rec();
                r.ev = rec;
                r.owed = rec.l == null ? new long[0] : rec.l;
                r.routers = rec.x == null ? new long[0] : rec.x;
                for (Ev e : ev) {
                    if ((e.k == v.pubOutcome || e.k == v.outcomeToRouter) && eq(e.r, rec.r) && eq(e.e, rec.e)) {
                        Object[] a = {e.q, e.o};
                        if (r.ans == null || cmpAll(a, r.ans) < 0) r.ans = a;
                    }
                }
                recs.add(r);
            }
            origin = null;
            for (Rec r : recs) {
                if (r.ev.p == null) {
                    origin = r;
                    break;
                }
            }
            pub = null;
            for (Ev p : pubs) {
                if (pub == null || cmpAll(new Object[] {p.q, p.t, p.o, p.r, p.e}, new Object[] {pub.q, pub.t, pub.o, pub.r, pub.e}) < 0) pub = p;
            }
            toldAccepted = false;
            for (Ev p : pubs) if (p.o == v.acc) toldAccepted = true;
            done = new ArrayList<>(accSubs);
            done.addAll(discarded);
            done.addAll(filteredOut);
            reached = new ArrayList<>();
            for (Ev x : recvAll) if (!has(reached, x.r)) reached.add(x.r);
            originAnswer = null;
            if (origin != null) {
                for (Ev p : pubs) {
                    if (eq(p.r, origin.ev.r) && eq(p.e, origin.ev.e)) {
                        originAnswer = p;
                        break;
                    }
                }
            }
            if (received && idEv == null) unusual("received events without their stream_seq", delivery);
            topic = idEv == null ? null : idEv.id.getUTF8String(0).toString();

            }

            void lost() {
            // --- lost
            if (toldAccepted) {
                for (Rec rec : recs) {
                    for (long s : rec.owed) {
                        if (has(done, s) || has(movedSubs, s) || ended(rec, s) || diedNondurable(rec, s)) continue;
                        List<Long> said = new ArrayList<>();
                        for (Ev e : ev) {
                            if ((e.k == v.subOutcome || e.k == v.expired) && eq(e.r, rec.ev.r) && eq(e.e, rec.ev.e) && eq(e.s, s)) {
                                long code = e.k == v.expired ? v.expiredCode : e.o;
                                if (!has(said, code)) said.add(code);
                            }
                        }
                        Long sent = null;
                        for (Send x : sends) if (eq(x.r, rec.ev.r) && eq(x.e, rec.ev.e) && eq(x.s, s) && (sent == null || x.q < sent)) sent = x.q;
                        Json info = new Json().field("said", said).field("sent", sent).field("answer", rec.ans == null ? null : rec.ans[1])
                                .field("answer_seq", rec.ans == null ? null : rec.ans[0]);
                        violations.add(violation("lost", null, rec.ev.r, rec.ev.e, rec.ev.q, rec.ev.t, s, null, info));
                    }
                }
                for (Long s : distinct(movedSubs)) {
                    if (has(done, s)) continue;
                    for (Ev m : moves) {
                        if (has(m.l, s)) {
                            violations.add(violation("lost", "moved", m.r, m.e, m.q, m.t, s, m.p, null));
                            break;
                        }
                    }
                }
                if (origin != null) {
                    for (long x : origin.routers) {
                        if (has(reached, x) || has(movedFrom, x) || c.missing.contains(x)) continue;
                        List<Long> told = toldBy(ev, origin, x);
                        boolean notNone = false;
                        for (Long y : told) if (y != v.none) notNone = true;
                        if (!(told.isEmpty() || notNone)) continue;
                        if (told.isEmpty() && (unreachable(origin, pub, x) || lostInterest(x, topic, origin, pub))) continue;
                        violations.add(violation("lost", "router", x, origin.ev.e, null, origin.ev.t, null, origin.ev.r, new Json().field("told", told)));
                    }
                }
            }
            }

            void duplicated() {
            // --- duplicated
            List<Ev> accepts = new ArrayList<>();
            for (Ev e : answers) {
                if (e.o != v.acc) continue;
                boolean placeheld = false;
                for (Ev p : placeholders) if (eq(p.r, e.r) && eq(p.e, e.e) && eq(p.s, e.s) && p.q < e.q) placeheld = true;
                if (!placeheld) accepts.add(e);
            }
            Map<Long, List<Ev>> bySub = new LinkedHashMap<>();
            for (Ev e : accepts) bySub.computeIfAbsent(e.s, z -> new ArrayList<>()).add(e);
            twice = new ArrayList<>();
            for (Map.Entry<Long, List<Ev>> g : bySub.entrySet()) if (g.getValue().size() > 1) twice.add(g);
            if (!alo) {
                for (Map.Entry<Long, List<Ev>> g : twice) {
                    Ev a0 = g.getValue().get(0);
                    List<Object> where = new ArrayList<>();
                    for (Ev a : g.getValue()) where.add(new Json().field("r", a.r).field("e", a.e).field("q", a.q));
                    violations.add(violation("duplicated", "id", a0.r, a0.e, a0.q, a0.t, g.getKey(), null, new Json().field("where", where)));
                }
            }
            }

            void invented() {
            // --- invented
            if (!received) {
                for (Ev e : ev) {
                    if (e.k < 256 && e.k >= 0 && v.referencing[e.k] && !(e.k == v.pubOutcome && e.y != null && e.y == 2)) {
                        violations.add(violation("invented", null, e.r, e.e, e.q, e.t, e.s, null, new Json().field("kind", e.k).field("outcome", e.o)));
                    }
                }
            }
            }

            void recordMissing() {
            // --- record-missing
            if (received) {
                Map<String, List<Ev>> orphans = new LinkedHashMap<>();
                for (Ev e : ev) {
                    if (e.k < 0 || e.k >= 256 || !v.needsRecord[e.k]) continue;
                    boolean orphan;
                    if (e.k == v.pubOutcome && e.y != null && e.y == 1) orphan = nothingBefore(ev, e);
                    else if (e.k == v.pubOutcome && e.y != null && e.y == 2) orphan = false;
                    else {
                        orphan = true;
                        for (Ev x : recvAll) if (eq(x.r, e.r) && eq(x.e, e.e) && x.q <= e.q) orphan = false;
                    }
                    if (orphan) orphans.computeIfAbsent(key(e.r, e.e), z -> new ArrayList<>()).add(e);
                }
                for (List<Ev> g : orphans.values()) {
                    Ev first = null;
                    for (Ev e : g) {
                        if (first == null || cmpAll(new Object[] {e.q, e.k, e.o, e.s, e.t}, new Object[] {first.q, first.k, first.o, first.s, first.t}) < 0) first = e;
                    }
                    Ev k0 = g.get(0);
                    List<Long> in = new ArrayList<>();
                    for (Ev x : recvAll) if (eq(x.r, k0.r)) in.add(x.e);
                    Json info = new Json().field("kind", first.k).field("outcome", first.o).field("more", g.size() - 1).field("received_in", in);
                    violations.add(violation("record-missing", null, k0.r, k0.e, first.q, first.t, first.s, null, info));
                }
            }
            }

            void arrival() {
            // --- arrival-unforwarded
            for (Ev x : recvAll) {
                if (x.p == null || c.missing.contains(x.p)) continue;
                boolean forwarded = false;
                for (Ev f : ev) if (f.k == v.forwardedToRouter && (has(f.l, x.r) || eq(f.p, x.r))) forwarded = true;
                if (!forwarded) violations.add(violation("arrival-unforwarded", null, x.r, x.e, x.q, x.t, null, x.p, null));
            }
            }

            void unowedAndUnsent() {
            // --- accept-unowed, accept-unsent
            List<Long> everOwed = new ArrayList<>(owedSubs);
            for (Send x : sends) everOwed.add(x.s);
            everOwed.addAll(movedSubs);
            for (Ev e : ev) if (e.k == v.placeholderFulfilled) everOwed.add(e.s);
            if (received) {
                Map<Long, Ev> unowed = new LinkedHashMap<>();
                for (Ev e : ev) {
                    if (e.k == v.subOutcome && !has(everOwed, e.s)) keepFirst(unowed, e.s, e);
                }
                for (Map.Entry<Long, Ev> g : unowed.entrySet()) {
                    Ev first = g.getValue();
                    Json info = new Json().field("outcome", first.o).field("attached", c.attached.contains(g.getKey()));
                    violations.add(violation("accept-unowed", null, first.r, first.e, first.q, first.t, g.getKey(), null, info));
                }
                Map<String, Ev> unsent = new LinkedHashMap<>();
                for (Ev e : answers) {
                    if (!has(everOwed, e.s)) continue;
                    boolean sentBefore = false;
                    for (Send x : sends) if (eq(x.r, e.r) && eq(x.e, e.e) && eq(x.s, e.s) && x.q < e.q) sentBefore = true;
                    if (!sentBefore) keepFirst(unsent, e.s + "|" + e.r, e);
                }
                for (Ev first : unsent.values()) {
                    violations.add(violation("accept-unsent", null, first.r, first.e, first.q, first.t, first.s, null, new Json().field("outcome", first.o)));
                }
            }
            }

            void answerMissing() {
            // --- answer-missing
            if (origin != null && originAnswer != null && !c.missing.contains(origin.ev.r)) {
                for (long x : origin.routers) {
                    Rec its = null;
                    for (Rec y : recs) {
                        if (eq(y.ev.r, x) && y.owed.length > 0) {
                            its = y;
                            break;
                        }
                    }
                    if (its == null || has(movedFrom, x) || c.missing.contains(x)) continue;
                    boolean heard = false;
                    for (Ev e : ev) if (e.k == v.outcomeFromRouter && eq(e.r, origin.ev.r) && eq(e.e, origin.ev.e) && eq(e.p, x)) heard = true;
                    if (heard) continue;
                    Ev routerAnswer = null;
                    for (Ev e : ev) {
                        if (e.k == v.outcomeToRouter && eq(e.r, x)
                                && (routerAnswer == null || cmpAll(new Object[] {e.q, e.o, e.e}, new Object[] {routerAnswer.q, routerAnswer.o, routerAnswer.e}) < 0)) {
                            routerAnswer = e;
                        }
                    }
                    boolean excused = false;
                    for (Route rt : routes(origin.ev.r, origin.ev.e)) {
                        if (rt.seq > origin.ev.q && rt.seq < originAnswer.q && !has(rt.reachable, x)) excused = true;
                    }
                    if (routerAnswer == null && c.died.contains(key(x, its.ev.e))) excused = true;
                    if (routerAnswer != null && routerAnswer.o == v.none) excused = true;
                    if (excused) continue;
                    Json info = new Json().field("outcome", originAnswer.o)
                            .field("received", new Json().field("e", its.ev.e).field("q", its.ev.q))
                            .field("owed", its.owed)
                            .field("answer", routerAnswer == null ? null : new Json().field("q", routerAnswer.q).field("o", routerAnswer.o).field("e", routerAnswer.e));
                    violations.add(violation("answer-missing", null, origin.ev.r, origin.ev.e, originAnswer.q, originAnswer.t, null, x, info));
                }
            }
            }

            void disagrees() {
            // --- outcome-disagrees
            pairs = new ArrayList<>(); // (r, e, s, ans, first (q, o))
            for (Rec rec : recs) {
                for (long s : rec.owed) {
                    Object[] first = null;
                    for (Ev e : ev) {
                        if ((e.k == v.subOutcome || e.k == v.expired) && eq(e.r, rec.ev.r) && eq(e.e, rec.ev.e) && eq(e.s, s)
                                && (rec.ans == null || e.q <= (Long) rec.ans[0])) {
                            Object[] a = {e.q, e.k == v.expired ? v.expiredCode : e.o};
                            if (first == null || cmpAll(a, first) < 0) first = a;
                        }
                    }
                    pairs.add(new Object[] {rec.ev.r, rec.ev.e, s, rec.ans, first});
                }
            }
            partial = false;
            if (origin != null) for (long x : origin.routers) if (c.missing.contains(x)) partial = true;
            for (Ev x : recvAll) {
                if (x.p != null && c.missing.contains(x.p)) partial = true;
                if (x.x != null) for (long m : x.x) if (c.missing.contains(m)) partial = true;
            }
            boolean allAccepted = !pairs.isEmpty();
            for (Object[] y : pairs) if (!has(accSubs, (Long) y[2])) allAccepted = false;
            List<Object[]> refused = new ArrayList<>();
            for (Object[] y : pairs) {
                Object[] first = (Object[]) y[4];
                if (first != null && v.badCodes[(Integer) first[1]] && !has(accSubs, (Long) y[2])) refused.add(y);
            }
            if (!partial) {
                for (Ev p : pubs) {
                    String kind = null;
                    if (p.o != v.acc && allAccepted && !unknowable(pairs, p, origin)) kind = "all-accepted";
                    else if (p.o == v.acc && !refused.isEmpty()) kind = "refused";
                    if (kind == null) continue;
                    List<Object> listed = new ArrayList<>();
                    for (Object[] y : kind.equals("refused") ? refused : pairs) {
                        Object[] first = (Object[]) y[4];
                        listed.add(new Json().field("s", y[2]).field("r", y[0]).field("first", first == null ? null : new Json().field("q", first[0]).field("o", first[1])));
                    }
                    violations.add(violation("outcome-disagrees", kind, p.r, p.e, p.q, p.t, null, null, new Json().field("outcome", p.o).field("pairs", listed)));
                }
            }
            }

            void leftUnsettled() {
            // --- left-unsettled
            diedWith = new ArrayList<>();
            for (Rec rec : recs) {
                boolean closed = false;
                Integer by = null;
                boolean byFound = false;
                List<Long> answered = new ArrayList<>();
                for (Ev e : ev) {
                    if (!eq(e.r, rec.ev.r) || !eq(e.e, rec.ev.e)) continue;
                    if ((e.k == v.settled && e.b != null && e.b) || e.k == v.recordDeleted) closed = true;
                    if (e.k == v.settled && !byFound) {
                        by = e.y;
                        byFound = true;
                    }
                    if (e.k == v.subOutcome || e.k == v.expired) answered.add(e.s);
                }
                if (closed) continue;
                if (c.died.contains(key(rec.ev.r, rec.ev.e))) {
                    diedWith.add(new Object[] {rec.ev.r, rec.ev.e});
                    continue;
                }
                List<Long> waiting = new ArrayList<>();
                for (long s : rec.owed) if (!has(answered, s) && !has(waiting, s)) waiting.add(s);
                Json info = new Json().field("by", by).field("answer", rec.ans == null ? null : new Json().field("q", rec.ans[0]).field("o", rec.ans[1]))
                        .field("waiting", waiting);
                violations.add(violation("left-unsettled", null, rec.ev.r, rec.ev.e, rec.ev.q, rec.ev.t, null, rec.ev.p, info));
            }
            }

            void applications() {
            // --- the applications' view
            app = null; // (s, n, first (fid, split, row, t))
            appMissing = new ArrayList<>();
            if (v.ledgers) {
                Map<Long, Object[]> bySubscriber = new LinkedHashMap<>();
                for (Ev e : apps) {
                    Object[] a = bySubscriber.get(e.s);
                    Object[] first = {e.p, e.e, e.q, e.t};
                    if (a == null) bySubscriber.put(e.s, new Object[] {e.s, 1, first});
                    else {
                        a[1] = (Integer) a[1] + 1;
                        if (cmpAll(first, (Object[]) a[2]) < 0) a[2] = first;
                    }
                }
                app = new ArrayList<>(bySubscriber.values());
                for (Object[] a : app) {
                    if ((Integer) a[1] > 1 && !alo) {
                        violations.add(violation("ledger", "twice", null, null, null, (Double) ((Object[]) a[2])[3], (Long) a[0], null, new Json().field("n", a[1])));
                    }
                }
                if (received || c.missing.isEmpty()) {
                    for (Object[] a : app) {
                        boolean sent = false;
                        for (Send x : sends) if (eq(x.s, (Long) a[0])) sent = true;
                        if (!sent && !partial) violations.add(violation("ledger", "unsent", null, null, null, (Double) ((Object[]) a[2])[3], (Long) a[0], null, null));
                    }
                }
                if (received) for (Long s : accSubs) if (!bySubscriber.containsKey(s)) appMissing.add(s);
            }
            }

            void firstSends() {
            // --- first sends (not of what the subscriber reported holding where it resumed)
            List<Object[]> fs0 = new ArrayList<>(); // (e, q, r, s, t)
            List<String> seen = new ArrayList<>();
            for (Send x : sends) {
                if (held(ev, placeholders, x)) continue;
                String rs = x.r + "|" + x.s;
                if (seen.contains(rs)) continue;
                seen.add(rs);
                Object[] min = null;
                for (Send y : sends) {
                    if (!eq(y.r, x.r) || !eq(y.s, x.s)) continue;
                    Object[] a = {y.e, y.q, y.r, y.s, y.t};
                    if (min == null || cmpAll(a, min) < 0) min = a;
                }
                fs0.add(min);
            }
            firstSends = fs0;
            if (alo) {
                firstSends = new ArrayList<>();
                for (Object[] x : fs0) {
                    boolean earlierElsewhere = false;
                    for (Object[] y : fs0) if (eq((Long) y[3], (Long) x[3]) && !eq((Long) y[2], (Long) x[2]) && (Double) y[4] < (Double) x[4]) earlierElsewhere = true;
                    if (!earlierElsewhere) firstSends.add(x);
                }
            }
            }

            void statuses() {
            // --- each subscriber's status
            List<Long> statusSubs = new ArrayList<>(owedSubs);
            for (Ev e : answers) if (!has(statusSubs, e.s)) statusSubs.add(e.s);
            subs = new ArrayList<>();
            for (Long s : statusSubs) {
                int o;
                if (has(accSubs, s)) o = v.acc;
                else {
                    o = 0;
                    for (Ev e : answers) {
                        if (eq(e.s, s)) {
                            o = e.o;
                            break;
                        }
                    }
                }
                subs.add(new Object[] {s, has(owedSubs, s), o});
            }
            filtered = new ArrayList<>(filteredOut);
            for (Ev e : ev) if (e.k == v.owedStateDiscarded && e.y != null && e.y == 3 && !has(filtered, e.s)) filtered.add(e.s);

            }

            Object[] row() {
            // --- the row
            Facts out = new Facts();
            out.delivery = deliveryText;
            out.id = idEv == null ? null : idEv.id;
            out.deliveryName = delivery;
            out.received = received;
            out.presettled = received && records.isEmpty();
            out.origin = origin;
            out.pub = pub == null ? null : new Object[] {pub.q, pub.t, pub.o, pub.r, pub.e};
            out.toldAccepted = toldAccepted;
            out.recs = recs;
            out.subs = subs;
            out.firstSends = firstSends;
            out.diedWith = diedWith;
            out.app = app;
            out.appMissing = appMissing;
            out.partial = partial;
            out.horizon = horizon;
            out.filtered = filtered;
            out.alo = alo;
            out.twice = twice;
            out.violations = violations;
            Object[] row = new Object[outColumns.length];
            for (int i = 0; i < row.length; i++) row[i] = out.column(outColumns[i]);
            return row;
            }
        }

        /** Some event of the delivery on the router and epoch of ``e`` before it (a remembered answer
         * needs no record); a ledger line (no router) at the same split and an earlier row makes
         * Spark's exists null, and NOT null keeps it out, as here. */
        static boolean nothingBefore(List<Ev> ev, Ev e) {
            for (Ev x : ev) {
                if (x.r == null) {
                    if (eq(x.e, e.e) && x.q != null && x.q < e.q) return false;
                } else if (eq(x.r, e.r) && eq(x.e, e.e) && x.q < e.q) {
                    return false;
                }
            }
            return true;
        }

        static <K> void keepFirst(Map<K, Ev> firsts, K key, Ev e) {
            Ev first = firsts.get(key);
            if (first == null || cmpAll(new Object[] {e.q, e.r, e.e, e.t, e.o}, new Object[] {first.q, first.r, first.e, first.t, first.o}) < 0) {
                firsts.put(key, e);
            }
        }

        boolean ended(Rec rec, long s) {
            End[] ends = c.ends.get(key(rec.ev.r, rec.ev.e, s));
            if (ends == null) return false;
            for (End x : ends) if (x.seq > rec.ev.q && (rec.ans == null || x.seq < (Long) rec.ans[0])) return true;
            return false;
        }

        boolean diedNondurable(Rec rec, long s) {
            if (rec.ans != null || !c.died.contains(key(rec.ev.r, rec.ev.e))) return false;
            long durable = 1;
            Span[] spans = c.durable.get(key(rec.ev.r, rec.ev.e, s));
            if (spans != null) {
                for (Span x : spans) {
                    if (x.from < rec.ev.q && rec.ev.q < x.to) {
                        durable = x.durable;
                        break;
                    }
                }
            }
            return durable == 0;
        }

        Route[] routes(Long r, Long e) {
            Route[] found = c.routes.get(key(r, e));
            return found == null ? new Route[0] : found;
        }

        List<Long> toldBy(List<Ev> ev, Rec origin, long x) {
            List<Long> told = new ArrayList<>();
            for (Ev e : ev) {
                if (e.k == v.outcomeFromRouter && eq(e.r, origin.ev.r) && eq(e.e, origin.ev.e) && eq(e.p, x)) {
                    long o = e.o;
                    if (!has(told, o)) told.add(o);
                }
            }
            return told;
        }

        boolean unreachable(Rec origin, Ev pub, long x) {
            for (Route rt : routes(origin.ev.r, origin.ev.e)) {
                if (rt.ts >= origin.ev.t && (pub == null || rt.seq < pub.q) && !has(rt.reachable, x)) return true;
            }
            return false;
        }

        boolean lostInterest(long x, String topic, Rec origin, Ev pub) {
            Gone[] gone = c.gone.get(Long.toString(x));
            if (gone == null) return false;
            for (Gone g : gone) {
                boolean matches = g.topic == null || g.topic.equals(topic) || (g.re != null && g.matches(topic));
                if (matches && g.ts >= origin.ev.t - v.clockSlack && g.ts <= pub.t + v.clockSlack) return true;
            }
            return false;
        }

        boolean unknowable(List<Object[]> pairs, Ev p, Rec origin) {
            for (Object[] y : pairs) {
                Long yr = (Long) y[0], ye = (Long) y[1];
                if (eq(yr, p.r) || y[3] != null) continue;
                if (c.died.contains(key(yr, ye))) return true;
                for (Route rt : routes(p.r, p.e)) {
                    boolean after = origin == null || !eq(origin.ev.r, p.r) || !eq(origin.ev.e, p.e) || rt.seq > origin.ev.q;
                    if (rt.seq < p.q && after && !has(rt.reachable, yr)) return true;
                }
            }
            return false;
        }

        boolean held(List<Ev> ev, List<Ev> placeholders, Send x) {
            for (Ev p : placeholders) if (eq(p.r, x.r) && eq(p.e, x.e) && eq(p.s, x.s)) return true;
            for (Ev e : ev) if (e.k == v.subOutcome && e.rep && eq(e.r, x.r) && eq(e.e, x.e) && eq(e.s, x.s)) return true;
            return false;
        }

        static Object[] violation(String check, String kind, Long r, Long e, Long q, Double t, Long s, Long other, Json info) {
            return new Object[] {check, kind, r, e, q, t, s, other, info == null ? null : info.done()};
        }

        /** One delivery's answers, in the output schema's columns. */
        final class Facts {
            UTF8String delivery;
            String deliveryName;
            InternalRow id;
            boolean received, presettled, toldAccepted, partial, horizon, alo;
            Rec origin;
            Object[] pub;
            List<Rec> recs;
            List<Object[]> subs, firstSends, diedWith, app, violations;
            List<Long> appMissing, filtered;
            List<Map.Entry<Long, List<Ev>>> twice;

            Object idField(int i) {
                if (id == null || id.isNullAt(i)) return null;
                return i == 5 ? (Object) id.getLong(5) : id.getUTF8String(i);
            }

            String idText(int i) {
                Object x = idField(i);
                return x == null ? null : x.toString();
            }

            Object column(int rule) {
                switch (rule) {
                    case 0: return delivery;
                    case 1: case 2: case 3: case 4: case 5: case 6: return idField(rule - 1);
                    case 7: {
                        Matcher m = SPLIT_NUMBER.matcher(deliveryName);
                        return joined(idText(1), idText(2), idText(3), idText(4), m.find() ? m.group(1) : "");
                    }
                    case 8: return joined(idText(1), idText(2), idText(3));
                    case 9: return received;
                    case 10: return presettled;
                    case 11: return origin == null ? null : origin.ev.r;
                    case 12: return origin == null ? null : origin.ev.e;
                    case 13: return origin == null ? null : origin.ev.t;
                    case 14: return pub;
                    case 15: return toldAccepted;
                    case 16: {
                        List<Object> out = new ArrayList<>(recs.size());
                        for (Rec r : recs) out.add(new Object[] {r.ev.r, r.ev.e, r.ev.t});
                        return out;
                    }
                    case 17: return subs;
                    case 18: return firstSends;
                    case 19: return diedWith;
                    case 20: return app;
                    case 21: return appMissing;
                    case 22: return partial;
                    case 23: return horizon;
                    case 24: return filtered;
                    case 25: return alo;
                    case 26: {
                        if (!alo) return null;
                        List<Object> out = new ArrayList<>();
                        for (Map.Entry<Long, List<Ev>> x : twice) out.add(new Object[] {x.getKey(), x.getValue().size() - 1});
                        return out;
                    }
                    case 27: {
                        if (!alo || app == null) return null;
                        List<Object> out = new ArrayList<>();
                        for (Object[] a : app) if ((Integer) a[1] > 1) out.add(new Object[] {a[0], (Integer) a[1] - 1});
                        return out;
                    }
                    case 28: return violations;
                    default: throw new IllegalArgumentException("eorouter: no rule " + rule);
                }
            }
        }

        /** concat_ws('|', ...): the values that are not null, joined. */
        static String joined(String... parts) {
            StringBuilder sb = new StringBuilder();
            boolean first = true;
            for (String p : parts) {
                if (p == null) continue;
                if (!first) sb.append('|');
                first = false;
                sb.append(p);
            }
            return sb.toString();
        }
    }

    // ------------------------------------------------------------------ Spark's values

    /** A Java value of the rules (Long, Integer, Double, Boolean, String, List, Object[] for a struct)
     * as Spark's internal value of ``type``. */
    static Object internal(Object value, DataType type) {
        if (value == null) return null;
        if (type instanceof StructType) {
            if (value instanceof InternalRow) return value;
            StructField[] fields = ((StructType) type).fields();
            Object[] in = (Object[]) value, out = new Object[fields.length];
            for (int i = 0; i < fields.length; i++) out[i] = internal(in[i], fields[i].dataType());
            return new GenericInternalRow(out);
        }
        if (type instanceof ArrayType) {
            DataType element = ((ArrayType) type).elementType();
            List<?> in = (List<?>) value;
            Object[] out = new Object[in.size()];
            for (int i = 0; i < out.length; i++) out[i] = internal(in.get(i), element);
            return new GenericArrayData(out);
        }
        if (type instanceof LongType) return ((Number) value).longValue();
        if (type instanceof IntegerType) return ((Number) value).intValue();
        if (type instanceof DoubleType) return ((Number) value).doubleValue();
        if (type instanceof BooleanType) return value;
        if (type instanceof StringType) return value instanceof UTF8String ? value : UTF8String.fromString(value.toString());
        throw new IllegalArgumentException("eorouter: no conversion to " + type);
    }

    // ------------------------------------------------------------------ the pass

    /** Reads narrow()'s rows (and app_events()'), by the input's own column names and types. */
    static final class Reader implements Serializable {
        private static final long serialVersionUID = 1L;
        final int h, delivery, r, e, q, t, k, s, o, p, l, f, x, b, y, fl, id, rep, pos;
        final DataType[] types;
        final int idFields;

        Reader(StructType schema) {
            types = new DataType[schema.fields().length];
            for (int i = 0; i < types.length; i++) types[i] = schema.fields()[i].dataType();
            h = schema.fieldIndex("h");
            delivery = schema.fieldIndex("delivery");
            r = schema.fieldIndex("r");
            e = schema.fieldIndex("e");
            q = schema.fieldIndex("q");
            t = schema.fieldIndex("t");
            k = schema.fieldIndex("k");
            s = schema.fieldIndex("s");
            o = schema.fieldIndex("o");
            p = schema.fieldIndex("p");
            l = schema.fieldIndex("l");
            f = schema.fieldIndex("f");
            x = schema.fieldIndex("x");
            b = schema.fieldIndex("b");
            y = schema.fieldIndex("y");
            fl = schema.fieldIndex("fl");
            id = schema.fieldIndex("id");
            rep = schema.fieldIndex("rep");
            pos = schema.fieldIndex("_pos");
            StructType idType = (StructType) types[id];
            idFields = idType.fields().length;
            String[] expected = {"topic", "publisher", "link_name", "incarnation", "pub_tag", "stream_seq"};
            if (!Arrays.equals(idType.fieldNames(), expected)) throw new IllegalArgumentException("eorouter: the id's fields are " + idType);
        }

        Long longOf(InternalRow row, int i) {
            if (row.isNullAt(i)) return null;
            return types[i] instanceof IntegerType ? (long) row.getInt(i) : row.getLong(i);
        }

        Integer intOf(InternalRow row, int i) {
            if (row.isNullAt(i)) return null;
            return types[i] instanceof LongType ? (int) row.getLong(i) : row.getInt(i);
        }

        long[] longs(InternalRow row, int i, UTF8String delivery) {
            if (row.isNullAt(i)) return null;
            ArrayData a = row.getArray(i);
            long[] out = new long[a.numElements()];
            for (int j = 0; j < out.length; j++) {
                if (a.isNullAt(j)) Judge.unusual("a list with a null in it", delivery.toString());
                out[j] = a.getLong(j);
            }
            return out;
        }

        Ev event(InternalRow row, UTF8String delivery) {
            Ev ev = new Ev();
            ev.r = longOf(row, r);
            ev.e = longOf(row, e);
            ev.q = longOf(row, q);
            ev.t = row.isNullAt(t) ? null : row.getDouble(t);
            Integer kind = intOf(row, k);
            ev.k = kind == null ? 0 : kind;
            ev.s = longOf(row, s);
            ev.o = intOf(row, o);
            ev.p = longOf(row, p);
            ev.l = longs(row, l, delivery);
            ev.f = longs(row, f, delivery);
            ev.x = longs(row, x, delivery);
            ev.fl = longs(row, fl, delivery);
            ev.b = row.isNullAt(b) ? null : row.getBoolean(b);
            ev.y = intOf(row, y);
            ev.rep = !row.isNullAt(rep) && row.getBoolean(rep);
            if (!row.isNullAt(id)) {
                ev.id = row.getStruct(id, idFields).copy();
                ev.streamSeq = ev.id.isNullAt(5) ? null : ev.id.getLong(5);
            }
            ev.d = delivery;
            Long place = longOf(row, pos);
            ev.pos = place == null ? Long.MIN_VALUE : place;
            return ev;
        }
    }

    /**
     * A delivery's events in the order the rules read them: Spark's ascending order (nulls first) of
     * (delivery, r, e, q, _pos), the order of reconcile.DELIVERY_ORDER after its hash.
     */
    static final java.util.Comparator<Ev> EVENT_ORDER = (a, b) -> {
        int c = a.d == b.d ? 0 : a.d.compareTo(b.d);
        if (c == 0) c = cmp(a.r, b.r);
        if (c == 0) c = cmp(a.e, b.e);
        if (c == 0) c = cmp(a.q, b.q);
        if (c == 0) c = Long.compare(a.pos, b.pos);
        return c;
    };

    /**
     * The facts of every delivery of ``hashed`` (narrow()'s rows, repartitioned and sorted by ``h``
     * alone: reconcile.hashed_deliveries), as a DataFrame of delivery_facts()' schema. A sort by one
     * long is Spark's radix sort; the events that share a hash (a delivery's, a dozen or so, and
     * another delivery's when two ids share a hash) are put in EVENT_ORDER here, where comparing
     * them costs a few field reads instead of Spark's comparison of whole rows.
     */
    public static Dataset<Row> facts(SparkSession spark, Dataset<Row> hashed, String vocabularyJson, String constantsJson) throws IOException {
        Vocabulary vocabulary = Vocabulary.parse(vocabularyJson);
        Constants constants = Constants.parse(constantsJson);
        Reader reader = new Reader(hashed.schema());
        // Without adaptive execution for this plan: an adaptive plan runs its shuffle's map side
        // when asked for its RDD, here; the one repartition by delivery gains nothing from it.
        String adaptive = spark.conf().get("spark.sql.adaptive.enabled");
        org.apache.spark.rdd.RDD<InternalRow> input;
        try {
            spark.conf().set("spark.sql.adaptive.enabled", "false");
            input = hashed.queryExecution().toRdd();
        } finally {
            spark.conf().set("spark.sql.adaptive.enabled", adaptive);
        }
        JavaRDD<InternalRow> rows = input.toJavaRDD().mapPartitions((Iterator<InternalRow> it) -> new Iterator<InternalRow>() {
            final Judge judge = new Judge(vocabulary, constants);
            /** The events of one hash, in EVENT_ORDER once read whole. */
            final List<Ev> run = new ArrayList<>();
            long runH;
            /** Where the next delivery of ``run`` begins (-1: ``run`` is still being read). */
            int from = -1;
            /** The last delivery id read (its events share this one object while it repeats). */
            UTF8String delivery;
            /** The row read past the end of ``run``: the first of the next hash. */
            InternalRow held;
            InternalRow pending;

            public boolean hasNext() {
                while (pending == null) {
                    if (from >= 0 && from < run.size()) {
                        pending = nextDelivery();
                        break;
                    }
                    run.clear();
                    from = -1;
                    if (held != null) {
                        take(held);
                        held = null;
                    }
                    while (it.hasNext()) {
                        InternalRow row = it.next();
                        if (!run.isEmpty() && row.getLong(reader.h) != runH) {
                            held = row; // (the sorted iterator's row stays valid until its next())
                            break;
                        }
                        take(row);
                    }
                    if (run.isEmpty()) return false;
                    for (int i = 1; i < run.size(); i++) {
                        if (EVENT_ORDER.compare(run.get(i - 1), run.get(i)) > 0) {
                            run.sort(EVENT_ORDER); // (stable: equal keys stay in the order read)
                            break;
                        }
                    }
                    from = 0;
                }
                return true;
            }

            void take(InternalRow row) {
                UTF8String rowDelivery = row.getUTF8String(reader.delivery);
                if (delivery == null || !rowDelivery.equals(delivery)) delivery = rowDelivery.clone();
                runH = row.getLong(reader.h);
                run.add(reader.event(row, delivery));
            }

            /** The facts of the delivery that begins at ``from`` in ``run``. */
            InternalRow nextDelivery() {
                UTF8String id = run.get(from).d;
                int to = from + 1;
                while (to < run.size() && run.get(to).d.equals(id)) to++;
                List<Ev> one = run.subList(from, to);
                from = to;
                return facts(one, id);
            }

            InternalRow facts(List<Ev> events, UTF8String id) {
                Object[] values = judge.judge(events, id);
                StructField[] fields = judge.schema.fields();
                Object[] out = new Object[fields.length];
                for (int i = 0; i < out.length; i++) out[i] = internal(values[i], fields[i].dataType());
                return new GenericInternalRow(out);
            }

            public InternalRow next() {
                if (!hasNext()) throw new NoSuchElementException();
                InternalRow out = pending;
                pending = null;
                return out;
            }
        });
        StructType schema = (StructType) DataType.fromJson(vocabulary.schemaJson);
        return ((org.apache.spark.sql.classic.SparkSession) spark).internalCreateDataFrame(rows.rdd(), schema, false);
    }
}
