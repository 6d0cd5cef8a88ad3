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

setup(
    ext_modules=[
        Extension(
            "router.adapter._fastpath",
            sources=["router/adapter/_fastpath.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
            optional=True,
        ),
        Extension(
            "router.core._admission",
            sources=["router/core/_admission.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
            optional=True,
        ),
        Extension(
            "router.core._answers",
            sources=["router/core/_answers.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
            optional=True,
        ),
        Extension(
            "router.core._msgfields",
            sources=["router/core/_msgfields.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
            optional=True,
        ),
    ],
)
