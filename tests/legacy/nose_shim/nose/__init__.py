"""The smallest stand-in for nose (which does not import on Python >= 3.12), for CuPy v1's tests.

CuPy v1's test helpers only need ``nose.plugins.attrib.attr`` (``cupy/testing/attr.py``).
Not a test runner: the tests run under pytest.
"""
