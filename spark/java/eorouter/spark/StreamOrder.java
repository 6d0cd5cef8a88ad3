package eorouter.spark;

import java.util.HashMap;
import java.util.Iterator;
import java.util.NoSuchElementException;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Publisher order (spark/reconcile.py _order_violations): within each group {@code g} (a subscriber's
 * copies of one publisher stream on one router, or in one application's ledger), a row whose
 * {@code stream_seq} is below the highest {@code (stream_seq, delivery)} of the rows before it is out of
 * order. The SQL is a window over each group sorted by its order columns: Spark sorts the rows by the group
 * and those columns (a comparison of whole rows whenever two share the group, which is nearly always),
 * then runs the window. Here the order columns come packed into one long {@code k} (reconcile.py says
 * when they fit), so the rows of a partition are sorted by {@code k} alone, Spark's radix sort, and one pass
 * keeps each group's running maximum in a map: rows of different groups may interleave, the order within
 * each group is {@code k}'s.
 *
 * <p>The SQL stays the specification; tests/spark/test_stream_order.py holds the two to the same rows.
 */
public final class StreamOrder {
    private StreamOrder() {}

    /** The job's error when a row's order key is null: outside the bounds it was packed for (spark/streamorder.py). */
    public static final String OUT_OF_RANGE = "eorouter: a publisher-order row outside its key's bounds";

    /** The highest (stream_seq, delivery) of a group's rows so far, as Spark orders a struct: nulls first. */
    private static final class Highest {
        boolean seqNull;
        long seq;
        UTF8String delivery;

        Highest(boolean seqNull, long seq, UTF8String delivery) {
            take(seqNull, seq, delivery);
        }

        void take(boolean seqNull, long seq, UTF8String delivery) {
            this.seqNull = seqNull;
            this.seq = seq;
            this.delivery = delivery == null ? null : delivery.clone();
        }

        /** Whether (seqNull/seq, delivery) orders above this one. */
        boolean below(boolean otherNull, long other, UTF8String otherDelivery) {
            if (seqNull != otherNull) return seqNull;
            if (!seqNull && seq != other) return seq < other;
            if (delivery == null || otherDelivery == null) return delivery == null && otherDelivery != null;
            return delivery.compareTo(otherDelivery) < 0;
        }
    }

    /**
     * The rows of {@code sorted} (partitioned by {@code g}, each partition sorted by {@code k}; with at least
     * the columns g, k, stream_seq and delivery) that are out of publisher order, each with {@code prev}:
     * struct&lt;stream_seq, delivery&gt;, the highest of its group before it.
     */
    public static Dataset<Row> violations(SparkSession spark, Dataset<Row> sorted) {
        StructType in = sorted.schema();
        int g = in.fieldIndex("g"), k = in.fieldIndex("k"), seq = in.fieldIndex("stream_seq"), id = in.fieldIndex("delivery");
        StructField[] fields = in.fields();
        DataType[] types = new DataType[fields.length];
        for (int i = 0; i < fields.length; i++) types[i] = fields[i].dataType();
        StructType prev = new StructType().add("stream_seq", DataTypes.LongType, true).add("delivery", DataTypes.StringType, true);
        StructType out = in.add("prev", prev, true);
        // Without adaptive execution for this plan, as DeliveryRules.facts (its shuffle would run here).
        String adaptive = spark.conf().get("spark.sql.adaptive.enabled");
        org.apache.spark.rdd.RDD<InternalRow> input;
        try {
            spark.conf().set("spark.sql.adaptive.enabled", "false");
            input = sorted.queryExecution().toRdd();
        } finally {
            spark.conf().set("spark.sql.adaptive.enabled", adaptive);
        }
        JavaRDD<InternalRow> rows = input.toJavaRDD().mapPartitions((Iterator<InternalRow> it) -> new Iterator<InternalRow>() {
            final HashMap<Long, Highest> highest = new HashMap<>();
            InternalRow pending;

            public boolean hasNext() {
                while (pending == null && it.hasNext()) {
                    InternalRow row = it.next();
                    if (row.isNullAt(k)) throw new IllegalStateException(OUT_OF_RANGE);
                    boolean seqNull = row.isNullAt(seq);
                    long s = seqNull ? 0 : row.getLong(seq);
                    UTF8String d = row.isNullAt(id) ? null : row.getUTF8String(id);
                    Highest h = highest.get(row.getLong(g));
                    if (h == null) {
                        highest.put(row.getLong(g), new Highest(seqNull, s, d));
                    } else if (!seqNull && !h.seqNull && s < h.seq) {
                        pending = violation(row, h); // (below the highest: it stays the highest)
                    } else if (h.below(seqNull, s, d)) {
                        h.take(seqNull, s, d);
                    }
                }
                return pending != null;
            }

            InternalRow violation(InternalRow row, Highest h) {
                Object[] values = new Object[types.length + 1];
                for (int i = 0; i < types.length; i++) {
                    Object v = row.isNullAt(i) ? null : row.get(i, types[i]);
                    values[i] = v instanceof UTF8String ? ((UTF8String) v).clone() : copied(v);
                }
                values[types.length] = new GenericInternalRow(new Object[] {h.seqNull ? null : h.seq, h.delivery});
                return new GenericInternalRow(values);
            }

            Object copied(Object v) {
                // (the sorted iterator's row is reused: nested values are copied out of it)
                if (v instanceof InternalRow) return ((InternalRow) v).copy();
                if (v instanceof org.apache.spark.sql.catalyst.util.ArrayData) return ((org.apache.spark.sql.catalyst.util.ArrayData) v).copy();
                return v;
            }

            public InternalRow next() {
                if (!hasNext()) throw new NoSuchElementException();
                InternalRow row = pending;
                pending = null;
                return row;
            }
        });
        return ((org.apache.spark.sql.classic.SparkSession) spark).internalCreateDataFrame(rows.rdd(), out, false);
    }
}
