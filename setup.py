"""The C part of the build; everything else is in pyproject.toml.

``gateway._fanout`` is optional: where no C compiler is found the install goes
on without it and the fan-out runs the same loop in Python (``gateway.wire``).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("gateway._fanout", ["gateway/_fanout.c"], optional=True)])
