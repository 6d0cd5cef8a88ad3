"""The one compiled part of eorouter: the adapter's fast path (router/adapter/_fastpath.c).

Everything else is in pyproject.toml. The extension is optional: without a C compiler
(or Python's headers) the install still succeeds and the router runs the same logic in
Python, more slowly (router/adapter/fastpath.py says which one a router uses).
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
    ],
)
