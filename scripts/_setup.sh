# Sourced by scripts/*: make (or reuse) the project venv and install the project into it.
# Idempotent and fast when nothing changed: the install is redone only when pyproject.toml, setup.py or
# a compiled part's source changes (the install builds them: router/**/*.c and *.h, setup.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${EOROUTER_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "eorouter needs Python >= 3.11 (found: $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
    exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV" >&2
    "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.eorouter-installed"
CDS_RECORD="$VENV/.eorouter-class-archive"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ] || [ "$ROOT/setup.py" -nt "$STAMP" ] \
        || [ -n "$(find "$ROOT/router" \( -name '*.c' -o -name '*.h' \) -newer "$STAMP" -print -quit)" ]; then
    echo "setup: installing eorouter[test] into $VENV (first run takes a minute)" >&2
    "$VENV/bin/python" -m pip install -q --upgrade pip >&2
    "$VENV/bin/python" -m pip install -q -e "$ROOT[test]" >&2
    # SASL PLAIN/SCRAM need Qpid Proton built against Cyrus SASL (docs/security.md); pip's wheel of it
    # may have been built without (no libsasl2-dev then): rebuild it once from source when Cyrus is here.
    # The wheel is kept in ~/.cache/eorouter so that the next fresh venv installs it in a second.
    if ! "$VENV/bin/python" -c 'import proton, sys; sys.exit(not proton.SASL.extended())' 2>/dev/null; then
        if command -v pkg-config >/dev/null 2>&1 && pkg-config --exists libsasl2; then
            WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/eorouter/proton-sasl-wheels"
            PROTON="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("python-qpid-proton"))')"
            if ! ls "$WHEELS"/python_qpid_proton-"$PROTON"-*.whl >/dev/null 2>&1; then
                echo "setup: building Qpid Proton $PROTON with Cyrus SASL (once, ~1 minute)" >&2
                "$VENV/bin/python" -m pip wheel -q --no-cache-dir --no-deps --no-binary python-qpid-proton \
                    -w "$WHEELS" "python-qpid-proton==$PROTON" >&2
            fi
            "$VENV/bin/python" -m pip install -q --no-index --find-links "$WHEELS" --force-reinstall --no-deps \
                "python-qpid-proton==$PROTON" >&2
        else
            echo "setup: Qpid Proton without Cyrus SASL (PLAIN/SCRAM logins unavailable; sudo scripts/setup-root)" >&2
        fi
    fi
    rm -f "$CDS_RECORD"  # the jars may have changed, and with them the archive's name: look again below
    touch "$STAMP"
fi
# Spark's classes, archived so that every reconciliation's JVM starts ~3 s faster (spark/jvm.py); the
# archiving run also compiles the proof's own Java classes (spark/jar.py, when javac is here), whose jar is
# on the class path the archive was made with, so an edit of spark/java/ makes both again. Checked
# on every run, not only at install: other checkouts' installs prune old archives (spark/jvm.py _prune),
# and a change of the JVM's options in spark/jvm.py names another archive. The record holds the archive's
# path, so that the usual run only tests that the file is there.
if [ "${EOROUTER_SPARK_CDS:-}" != off ] && command -v java >/dev/null 2>&1 \
        && { [ ! -f "$CDS_RECORD" ] || [ ! -f "$(cat "$CDS_RECORD")" ] || [ "$ROOT/spark/jvm.py" -nt "$CDS_RECORD" ] \
             || [ -n "$(find "$ROOT/spark/java" -newer "$CDS_RECORD" -print -quit)" ]; }; then
    echo "setup: archiving Spark's classes for fast JVM starts (once, under a minute)" >&2
    if ARCHIVE="$(cd "$ROOT" && "$VENV/bin/python" -m spark.jvm)" && [ -f "$ARCHIVE" ]; then
        printf '%s' "$ARCHIVE" > "$CDS_RECORD"
    else
        echo "setup: no class archive (not needed)" >&2
    fi
fi
export PATH="$VENV/bin:$PATH"
