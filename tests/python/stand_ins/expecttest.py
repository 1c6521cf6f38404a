"""Stand-in for the ``expecttest`` package (not packaged in Debian), put on sys.path by
test_torch_distributed_suite.py only when the real one is not installed.

torch.testing._internal.common_utils needs only ``expecttest.TestCase`` (the base of its TestCase)
and ``expecttest.ACCEPT``; the distributed suite never calls ``assertExpectedInline``, so it is
not provided here (a call fails with AttributeError rather than passing).
"""

import unittest

#: Whether expected outputs are rewritten instead of compared (never, here).
ACCEPT = False


class TestCase(unittest.TestCase):
    pass
