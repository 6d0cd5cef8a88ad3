package eorouter.spark;

import java.io.IOException;
import java.util.Iterator;
import java.util.List;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.sql.DataFrameReader;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.XXH64;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The applications' ledgers (spark/load.py, load_ledgers) read in plain Java: each line parsed once
 * by LineScan's parser against the fields the proof reads, into the rows the SQL read makes (those
 * fields, the file's hash, the split's start and the line's place in its partition, as Spark's own
 * functions compute them), over the same text splits. A line not exactly in the writer's shape fails
 * the job with UNUSUAL, and the ledgers are read in Spark SQL instead (spark/reconcile.py).
 */
public final class LedgerScan {
    private LedgerScan() {}

    /** The job's error when a ledger line is not in the writer's shape (spark/linescan.py). */
    public static final String UNUSUAL = "eorouter: a ledger line not in the writer's shape";

    /**
     * The rows of the ledgers at ``paths`` in ``schemaJson`` (load_ledgers()' schema: the fields read,
     * then fid, split and row), only lines with an event, as load_ledgers() keeps them.
     */
    @SuppressWarnings("unchecked")
    public static Dataset<Row> rows(SparkSession spark, List<String> paths, String schemaJson, boolean recursive) throws IOException {
        StructType schema = (StructType) DataType.fromJson(schemaJson);
        int read = schema.fields().length - 3;
        StringBuilder fields = new StringBuilder("{\"fields\": [");
        for (int i = 0; i < read; i++) {
            if (i > 0) fields.append(", ");
            fields.append("[\"").append(schema.fields()[i].name()).append("\", \"").append(schema.fields()[i].dataType().simpleString()).append("\"]");
        }
        LineScan.Spec spec = LineScan.Spec.fieldsOnly(fields.append("]}").toString());
        int event = spec.field("event");
        DataFrameReader reader = spark.read();
        if (recursive) reader = reader.option("recursiveFileLookup", "true").option("pathGlobFilter", "*.jsonl");
        Dataset<Row> text = reader.text(paths.toArray(new String[0])).select(
            functions.col("value"),
            functions.col("_metadata.file_size"),
            functions.col("_metadata.file_modification_time"),
            functions.col("_metadata.file_block_start"));
        JavaRDD<InternalRow> rows = text.queryExecution().toRdd().toJavaRDD().mapPartitions((Iterator<InternalRow> it) -> new Iterator<InternalRow>() {
            final LineScan.Scanner scanner = new LineScan.Scanner(spec);
            long place = -1; // the line's place in the partition (monotonically_increasing_id's low bits)
            long size = -1, modified = -1, fid;
            InternalRow next;

            void line(byte[] bytes, int offset, int length) {
                String why;
                try {
                    why = scanner.parse(bytes, offset, length);
                } catch (IOException | RuntimeException e) {
                    why = "not the writer's JSON: " + e.getMessage();
                }
                if (why != null) throw new IllegalStateException(UNUSUAL + " (" + why + ")");
            }

            public boolean hasNext() {
                while (next == null && it.hasNext()) {
                    InternalRow in = it.next();
                    place++;
                    LineScan.feed(in, this::line);
                    if (!scanner.has(event)) continue;
                    if (in.getLong(1) != size || in.getLong(2) != modified) {
                        size = in.getLong(1);
                        modified = in.getLong(2);
                        fid = XXH64.hashLong(modified, XXH64.hashLong(size, DeliveryScan.SEED));
                    }
                    Object[] row = new Object[read + 3];
                    for (int f = 0; f < read; f++) {
                        Object v = scanner.value(f);
                        row[f] = v instanceof String ? UTF8String.fromString((String) v) : v;
                    }
                    row[read] = fid;
                    row[read + 1] = in.getLong(3);
                    row[read + 2] = place;
                    next = new GenericInternalRow(row);
                }
                return next != null;
            }

            public InternalRow next() {
                if (!hasNext()) throw new java.util.NoSuchElementException();
                InternalRow out = next;
                next = null;
                return out;
            }
        });
        return ((org.apache.spark.sql.classic.SparkSession) spark).internalCreateDataFrame(rows.rdd(), schema, false);
    }
}
