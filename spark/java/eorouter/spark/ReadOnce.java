package eorouter.spark;

import java.io.IOException;
import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;
import java.util.TreeMap;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.util.AccumulatorV2;

/**
 * The proof's two reads of the routers' JSON lines as one parse (spark/linescan.py): each line is
 * parsed once, folded into the first read's facts (LineScan) and made into the per-delivery pass's
 * rows (DeliveryScan), in one Spark job that ends in the one shuffle by delivery.
 *
 * <p>The per-delivery rules need the first read's facts (the epochs, the resume windows, the routers
 * whose logs are missing), but only on the reduce side of that shuffle: so the map side runs first,
 * its rows written to the shuffle and each partition's facts handed to the driver through an
 * accumulator; the driver merges the facts, and the reduce side reads the shuffle later, with them.
 * A partition's facts are kept under its index, so a partition computed twice (a retried task, a
 * lost shuffle recomputed) gives its facts once.
 *
 * <p>Once a line is not in the writer's shape the whole input goes to Spark SQL (as with
 * LineScan alone): the partition makes no more rows, only counts the lines it cannot vouch for, and
 * the driver drops the shuffle.
 */
public final class ReadOnce {
    /** The job's error when a line read again is not in the writer's shape now (spark/linescan.py). */
    public static final String CHANGED = "eorouter: a line the first read's scan accepted is not in the writer's shape now";

    private final LineScan.Spec spec;
    private final PartitionFacts facts;
    private final Dataset<Row> rows;
    private final int partitions;

    private ReadOnce(LineScan.Spec spec, PartitionFacts facts, Dataset<Row> rows, int partitions) {
        this.spec = spec;
        this.facts = facts;
        this.rows = rows;
        this.partitions = partitions;
    }

    /** Each partition's facts, by partition index. */
    static final class PartitionFacts extends AccumulatorV2<Object[], Map<Integer, LineScan.Facts>> {
        private static final long serialVersionUID = 1L;
        private final HashMap<Integer, LineScan.Facts> parts = new HashMap<>();

        @Override
        public boolean isZero() {
            return parts.isEmpty();
        }

        @Override
        public PartitionFacts copy() {
            PartitionFacts c = new PartitionFacts();
            c.parts.putAll(parts);
            return c;
        }

        @Override
        public void reset() {
            parts.clear();
        }

        /** {partition index, its facts}. */
        @Override
        public void add(Object[] part) {
            parts.put((Integer) part[0], (LineScan.Facts) part[1]);
        }

        @Override
        public void merge(AccumulatorV2<Object[], Map<Integer, LineScan.Facts>> other) {
            parts.putAll(other.value());
        }

        @Override
        public Map<Integer, LineScan.Facts> value() {
            return parts;
        }
    }

    /**
     * The one parse of the files at ``paths``: its rows (narrow()'s schema, as DeliveryScan.events
     * makes them) are ``rows()``; its facts are ``facts()`` once a job has read every partition of
     * them (the shuffle's map side, ``mapSide``).
     */
    public static ReadOnce scan(SparkSession spark, java.util.List<String> paths, String specJson, String deliveryJson, boolean recursive)
            throws IOException {
        DeliveryScan.Vocabulary vocabulary = DeliveryScan.Vocabulary.parse(specJson, deliveryJson);
        PartitionFacts facts = new PartitionFacts();
        spark.sparkContext().register(facts, "eorouter first read");
        JavaRDD<InternalRow> rows = LineScan.lines(spark, paths, recursive).mapPartitions((Iterator<InternalRow> it) -> new Iterator<InternalRow>() {
            final DeliveryScan.Narrower narrower = new DeliveryScan.Narrower(vocabulary);
            final LineScan.Scanner scanner = narrower.scanner;
            int next;
            boolean told;

            void line(byte[] bytes, int offset, int length) {
                long before = scanner.facts.unusualLines;
                scanner.scan(bytes, offset, length);
                if (scanner.facts.unusualLines == 0) {
                    narrower.parsed();
                    return;
                }
                // A stage run again (its shuffle's output lost) reads lines the driver's facts
                // already vouched for: one not in the writer's shape now is a changed file.
                if (TaskContext.get().stageAttemptNumber() > 0) throw new IllegalStateException(CHANGED + " (" + scanner.facts.unusual + ")");
                // After a line it cannot vouch for, the partition only counts such lines: the
                // input is read in Spark SQL, and these rows are dropped.
                if (before == 0) narrower.out.clear();
            }

            public boolean hasNext() {
                while (next >= narrower.out.size()) {
                    if (!it.hasNext()) {
                        if (!told) {
                            told = true;
                            facts.add(new Object[] {TaskContext.getPartitionId(), scanner.facts});
                        }
                        return false;
                    }
                    narrower.out.clear();
                    next = 0;
                    LineScan.feed(it.next(), this::line);
                }
                return true;
            }

            public InternalRow next() {
                if (!hasNext()) throw new java.util.NoSuchElementException();
                return narrower.out.get(next++);
            }
        });
        StructType schema = (StructType) DataType.fromJson(vocabulary.schemaJson);
        Dataset<Row> frame = ((org.apache.spark.sql.classic.SparkSession) spark).internalCreateDataFrame(rows.rdd(), schema, false);
        return new ReadOnce(vocabulary.spec, facts, frame, rows.getNumPartitions());
    }

    public Dataset<Row> rows() {
        return rows;
    }

    /** The merged facts (LineScan.inputFacts' JSON) of every partition; null if some partition was not read yet. */
    public String facts() throws IOException {
        Map<Integer, LineScan.Facts> parts = new TreeMap<>(facts.value());
        if (parts.size() != partitions) return null;
        return LineScan.merged(spec, parts.values());
    }

    /**
     * Runs the map side of ``shuffled``'s shuffle now (``shuffled``: a plan whose top is one
     * repartition) and returns a frame that reads its output: the same rows, in the same
     * partitions, without running the map side again.
     */
    public static Dataset<Row> mapSide(SparkSession spark, Dataset<Row> shuffled) {
        // An adaptive plan, asked for its RDD, runs every stage but the last (here: the shuffle's
        // map side) there and then, and hands back the last stage's RDD: the shuffle's reader.
        String adaptive = spark.conf().get("spark.sql.adaptive.enabled");
        org.apache.spark.rdd.RDD<InternalRow> reader;
        try {
            spark.conf().set("spark.sql.adaptive.enabled", "true");
            reader = shuffled.queryExecution().toRdd();
        } finally {
            spark.conf().set("spark.sql.adaptive.enabled", adaptive);
        }
        return ((org.apache.spark.sql.classic.SparkSession) spark).internalCreateDataFrame(reader, shuffled.schema(), false);
    }
}
