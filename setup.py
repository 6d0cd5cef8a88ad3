"""The compiled parts of eorouter: the adapter's fast path (router/adapter/_fastpath.c),
the core's twins of its steps for a publisher's message and subscribers' accepted answers
(router/core/_admission.c, _answers.c) and its reader of
the application properties selectors read (router/core/_msgfields.c).

Everything else is in pyproject.toml. The extensions are optional: without a C compiler
(or Python's headers) the install still succeeds and the router runs the same logic in
Python, more slowly (router/adapter/fastpath.py says which one a router uses;
router/core/msgfields.py and router/core/router.py keep the Python code as the
specification).
"""

from setuptools import Extension, setup

WARNINGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"]


def compiled(module: str, depends: tuple[str, ...] = ()) -> Extension:
    """``module`` (router.x._y) from router/x/_y.c; optional: a failed build leaves the Python path."""
    return Extension(
        module,
        sources=[module.replace(".", "/") + ".c"],
        depends=list(depends),
        extra_compile_args=WARNINGS,
        optional=True,
    )


ATTRS = ("router/core/_attrs.h",)  # attributes by name, shared by every compiled part but _msgfields
RECYCLE = ("router/core/_recycle.h",)  # commands and events kept for reuse
CORE_OBJECTS = ("router/core/_coreobjects.h", *ATTRS, *RECYCLE)  # what the core's twins share

setup(
    ext_modules=[
        compiled("router.adapter._fastpath", (*ATTRS, *RECYCLE, "router/adapter/_jsonfields.h", "router/adapter/_logbuffer.h")),
        compiled("router.core._admission", CORE_OBJECTS),
        compiled("router.core._answers", CORE_OBJECTS),
        compiled("router.core._msgfields"),
    ],
)
